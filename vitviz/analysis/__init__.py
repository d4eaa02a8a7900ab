"""Pure analyses of a capture: maps, rollout, relevance, masks, summaries, embeddings."""
