"""Speed and memory benchmarks of vitviz against plain inference (``python -m benchmarks``)."""
