"""The instant head view: every layer x head of a plain ViT, switched in the browser without calling Python.

BertViz's idea for images: the page receives the attention maps once, and layer,
head and query change in JavaScript, so a change redraws in milliseconds instead
of a server round trip. :func:`head_view_html` returns one self-contained HTML page
(no network, no external script) for a notebook output (in an ``iframe``) or the
app (``streamlit.components.v1.html``).

What is sent, and how exactly: for each block l, head h and query token q the row
``A[l, h, q, P:]`` (attention from q to every patch, P prefix tokens skipped: they
are not on the image) as 8 bits relative to that row's maximum, plus the row
maximum in float32, so a value reads back as ``code / 255 * max`` (error at most
``max / 510``, below one colour step of the 256-colour scale). The attention each
query pays to the prefix tokens is sent in float32 and shown beside the map. The
maps are deflated and base64-encoded; :data:`DEFAULT_MAX_BYTES` (8 MB) bounds the
page: a record above it is refused with :class:`HeadViewTooLarge`, and the caller
falls back to static figures (the app's server-drawn view, a notebook's Plotly figure).

The data reach the page once, as JSON in a ``<script type="application/json">`` element with
``<``, ``>`` and ``&`` escaped (:func:`script_json`); the page's script reads them with
``JSON.parse`` and shows every name (title, layers, prefix tokens) as text. No string of a
model or a visitor is ever spliced into the markup, and nothing is substituted after the data.

No torch here: the input is the record's ``(L, H, T, T)`` attention stack.
"""

from __future__ import annotations

import base64
import io
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_MAX_BYTES",
    "HeadViewTooLarge",
    "HeadViewData",
    "head_view_data",
    "head_view_html",
    "head_view_problem",
    "record_problem",
    "pack_rows",
    "unpack_rows",
    "script_json",
]

DEFAULT_MAX_BYTES = 8_000_000  # the whole page; ViT-B/16 at 224 px needs about 4.5 MB


class HeadViewTooLarge(ValueError):
    """The maps would not fit the page's byte budget (``nbytes``: what the page would take, at least)."""

    def __init__(self, message: str, nbytes: float = 0) -> None:
        super().__init__(message)
        self.nbytes = int(nbytes)


def head_view_problem(attention: np.ndarray | None, grid: tuple[int, int], num_prefix: int) -> str:
    """Why the instant head view cannot show this record ('' when it can).

    ``attention``: the record's dense ``(L, H, T, T)`` stack, None for hierarchical models.
    """
    if attention is None:
        return (
            "the instant head view needs one token grid shared by every block (a plain ViT); this model attends "
            "in windows, over reduced keys or in stages"
        )
    if attention.ndim != 4 or attention.shape[2] != attention.shape[3]:
        return f"expected an (L, H, T, T) attention stack, got shape {tuple(attention.shape)}"
    if attention.shape[2] != num_prefix + grid[0] * grid[1]:
        return (
            f"{attention.shape[2]} tokens do not make {num_prefix} prefix tokens and a {grid[0]} x {grid[1]} grid "
            "(padding tokens?)"
        )
    return ""


def record_problem(cap) -> str:
    """:func:`head_view_problem` for a capture record, which must also hold every block in its stack (an
    attention-pooling head, as CCT's or SigLIP's, is a block outside the stack: its view is server-drawn)."""
    stack = cap.attention_stack
    if stack is not None and stack.shape[0] != cap.num_blocks:
        return (
            f"{cap.model_name} ends in a {cap.block_label(cap.num_blocks - 1)} that attends from a probe, not "
            "from the tokens"
        )
    return head_view_problem(stack, cap.grid, cap.num_prefix_tokens)


def pack_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows to 8-bit codes relative to each row's maximum: ``(..., N) -> ((..., N) uint8, (...) float32 max)``.

    ``code = round(255 * value / max)``; an all-zero row keeps max 0 and codes 0.
    """
    rows = np.asarray(rows, dtype=np.float32)
    top = rows.max(axis=-1)
    top = np.where(np.isfinite(top) & (top > 0), top, 0).astype(np.float32)
    scale = np.where(top > 0, 255.0 / np.where(top > 0, top, 1), 0)
    codes = np.clip(np.rint(rows * scale[..., None]), 0, 255).astype(np.uint8)
    return codes, top


def unpack_rows(codes: np.ndarray, top: np.ndarray) -> np.ndarray:
    """The inverse of :func:`pack_rows` (what the browser computes): ``code / 255 * max``, float32."""
    return codes.astype(np.float32) / 255.0 * np.asarray(top, dtype=np.float32)[..., None]


def _b64(raw: bytes, *, deflate: bool) -> str:
    # level 1: a ViT-B/16 record deflates in ~0.07 s instead of ~0.5 s at level 6, for ~15 % more bytes
    return base64.b64encode(zlib.compress(raw, 1) if deflate else raw).decode("ascii")


def _png_b64(image: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(buf, format="PNG", optimize=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _lut(name: str) -> list[str]:
    """256 hex colours of a Plotly colour scale, lowest first (Inferno's starts at #000004)."""
    from plotly.colors import get_colorscale, sample_colorscale

    colours = sample_colorscale(get_colorscale(name), list(np.linspace(0, 1, 256)), colortype="rgb")
    out = []
    for c in colours:
        r, g, b = (round(float(v)) for v in c[c.index("(") + 1 : -1].split(","))
        out.append(f"#{r:02x}{g:02x}{b:02x}")
    return out


@dataclass(frozen=True)
class HeadViewData:
    """What the page receives (JSON-able). ``maps``: deflated base64 of ``(L, H, T, gh*gw)`` uint8 codes."""

    layers: int
    heads: int
    tokens: int
    grid: tuple[int, int]
    prefix: tuple[str, ...]
    maps: str
    maxima: str  # base64 of (L, H, T) float32
    prefix_share: str  # base64 of (L, H, T, P) float32
    image: str  # base64 PNG
    lut: tuple[str, ...]
    title: str
    layer_names: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return len(self.maps) + len(self.maxima) + len(self.prefix_share) + len(self.image) + 4096

    def to_dict(self) -> dict:
        d = self.__dict__.copy()
        d["grid"], d["prefix"], d["lut"] = list(self.grid), list(self.prefix), list(self.lut)
        d["layer_names"] = list(self.layer_names)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def head_view_data(
    attention: np.ndarray,
    *,
    grid: tuple[int, int],
    prefix_kinds: Sequence[str],
    image: np.ndarray,
    title: str = "",
    layer_names: Sequence[str] | None = None,
    colorscale: str = "Inferno",
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> HeadViewData:
    """Pack a plain ViT's ``(L, H, T, T)`` attention and its ``(h, w, 3)`` uint8 input image for the page.

    Raises ``ValueError`` when the record has no single grid, :class:`HeadViewTooLarge` above ``max_bytes``.
    """
    attention = None if attention is None else np.asarray(attention)
    prefix = tuple(prefix_kinds)
    problem = head_view_problem(attention, grid, len(prefix))
    if problem:
        raise ValueError(problem)
    L, H, T, _ = attention.shape
    P = len(prefix)
    # an early estimate: codes deflate to about half, base64 adds a third
    estimate = L * H * T * (T - P) * 0.4
    if estimate > max_bytes:
        raise HeadViewTooLarge(_too_large(estimate, max_bytes), estimate)
    codes, top = pack_rows(attention[..., P:])
    data = HeadViewData(
        layers=L,
        heads=H,
        tokens=T,
        grid=(int(grid[0]), int(grid[1])),
        prefix=prefix,
        maps=_b64(codes.tobytes(), deflate=True),
        maxima=_b64(top.astype("<f4").tobytes(), deflate=True),
        prefix_share=_b64(np.ascontiguousarray(attention[..., :P], dtype="<f4").tobytes(), deflate=True),
        image=_png_b64(image),
        lut=tuple(_lut(colorscale)),
        title=title,
        layer_names=tuple(layer_names) if layer_names is not None else tuple(f"block {i}" for i in range(L)),
    )
    if data.nbytes > max_bytes:
        raise HeadViewTooLarge(_too_large(data.nbytes, max_bytes), data.nbytes)
    return data


def _too_large(nbytes: float, limit: int) -> str:
    # no advice here: what to do instead is the caller's (the app draws on the server, a notebook raises the limit)
    return f"the head view would send {nbytes / 1e6:.1f} MB to the browser (limit {limit / 1e6:.1f} MB)"


def head_view_html(
    data: HeadViewData,
    *,
    height: int = 620,
    layer: int | None = None,
    head: int = 0,
    query: int = 0,
    opacity: float | None = None,
) -> str:
    """One self-contained HTML page for :class:`HeadViewData` (see the module docstring for what it shows).

    It opens on ``layer`` (default: the last), ``head`` and ``query`` (a token index, 0: the first prefix token),
    with the large map over the photo at ``opacity`` (0..1; default: the page's own, 1, the map alone).

    The page exposes ``window.vitvizState`` (layer, head, query, scale), ``window.vitvizTimings``
    (milliseconds per redraw) and sets ``document.body.dataset.ready = "1"`` once the maps are decoded,
    so a browser test can drive and time it.
    """
    start = {
        "layer": min(max(data.layers - 1 if layer is None else int(layer), 0), data.layers - 1),
        "head": min(max(int(head), 0), data.heads - 1),
        "query": min(max(int(query), 0), data.tokens - 1),
    }
    if opacity is not None:
        start["opacity"] = min(max(float(opacity), 0.0), 1.0)
    before, after = _PAGE.split(_SLOT)  # one slot: the data go in once, and nothing is searched again afterwards
    return before + script_json({**data.to_dict(), "start": start}) + after


def script_json(value: object) -> str:
    """``value`` as JSON that is safe inside a ``<script type="application/json">`` element.

    ``<``, ``>`` and ``&`` become ``\\u003c``, ``\\u003e`` and ``\\u0026`` (JSON escapes, so ``JSON.parse`` reads the
    same strings back): no text of a model or visitor (a folder named ``</script><script>...``) can close the
    element or open another, and the HTML parser never sees an entity or a comment in it.
    """
    text = json.dumps(value)  # ASCII only: U+2028 and other non-ASCII characters are \\u escapes already
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


_SLOT = "__VITVIZ_HEAD_VIEW_DATA__"
_PAGE = r"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>vitviz head view</title>
<style>
 body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:6px;color:#222;background:#fff;font-size:13px}
 .row{display:flex;gap:14px;align-items:flex-start;flex-wrap:wrap}
 .ctl{display:flex;gap:12px;align-items:center;flex-wrap:wrap;margin-bottom:6px}
 .ctl label{display:flex;gap:4px;align-items:center}
 #big{cursor:crosshair;border:1px solid #ccc;image-rendering:auto}
 #thumbs{display:grid;gap:2px}
 #thumbs canvas{width:30px;height:30px;image-rendering:pixelated;border:2px solid transparent;cursor:pointer}
 #thumbs canvas.sel{border-color:#00b8d4}
 #thumbs .lab{font-size:10px;color:#666;text-align:right;padding-right:3px;line-height:34px}
 #bar{height:10px;width:256px;display:block}
 .note{color:#555;font-size:12px;max-width:620px}
 #err{color:#b00020}
</style></head>
<body>
<div id="err"></div>
<div class="ctl">
 <b id="title"></b>
 <label>Block <input id="layer" type="range" min="0" value="0"><span id="layerv"></span></label>
 <label>Head <input id="head" type="range" min="0" value="0"><span id="headv"></span></label>
 <label>Query <select id="query"></select></label>
 <label>Scale <select id="scale"><option value="map">per map [0, max]</option><option value="layer">shared in the block</option></select></label>
 <label>Opacity <input id="opacity" type="range" min="0" max="100" value="100"></label>
 <button id="save" title="Download the large map as PNG">PNG</button>
</div>
<div class="row">
 <div>
  <canvas id="big" width="448" height="448"></canvas>
  <div><canvas id="bar" width="256" height="1"></canvas><span id="range"></span></div>
  <div id="hover" class="note">&nbsp;</div>
  <div id="prefix" class="note"></div>
 </div>
 <div><div class="note" style="max-width:260px">Every block (rows) x head (columns) for this query; click one to
 enlarge.</div><div id="thumbs"></div></div>
</div>
<div class="note">Attention from the query token to each patch, A[block, head, query, patch], raw softmax weights
(prefix tokens are not on the image: their share is printed under the map). Maps travel at 8 bits per map, relative
to the map's maximum (error at most max/510). Click a patch of the large map to make it the query.</div>
<script id="vitviz-data" type="application/json">__VITVIZ_HEAD_VIEW_DATA__</script>
<script>
(function(){
// every name shown (title, layers, prefix tokens) is set as text (textContent), never as markup
const D = JSON.parse(document.getElementById("vitviz-data").textContent);
document.getElementById("title").textContent = D.title;
const L=D.layers, H=D.heads, T=D.tokens, gh=D.grid[0], gw=D.grid[1], N=gh*gw, P=D.prefix.length;
const S = window.vitvizState = Object.assign({scale: "map", opacity: 1}, D.start);
window.vitvizTimings = [];
let codes=null, maxima=null, share=null;
const lut = D.lut.map(h=>[parseInt(h.slice(1,3),16),parseInt(h.slice(3,5),16),parseInt(h.slice(5,7),16)]);
const $ = id => document.getElementById(id);
function b64bytes(s){const bin=atob(s);const a=new Uint8Array(bin.length);for(let i=0;i<bin.length;i++)a[i]=bin.charCodeAt(i);return a;}
async function inflate(s){
  const ds = new DecompressionStream("deflate");
  const buf = await new Response(new Blob([b64bytes(s)]).stream().pipeThrough(ds)).arrayBuffer();
  return new Uint8Array(buf);
}
function f32(u8){return new Float32Array(u8.buffer, u8.byteOffset, u8.byteLength/4);}
const img = new Image();
img.src = "data:image/png;base64," + D.image;
const big=$("big"), bctx=big.getContext("2d");
const cell = document.createElement("canvas"); cell.width=gw; cell.height=gh;
const cctx = cell.getContext("2d");
const thumbs=[];
function rowIndex(l,h,q){return (l*H+h)*T+q;}
// value of patch n in map (l,h,q): code/255*max
function value(l,h,q,n){return codes[rowIndex(l,h,q)*N+n]/255*maxima[rowIndex(l,h,q)];}
function top(l,h,q){
  if(S.scale==="layer"){let m=0;for(let k=0;k<H;k++)m=Math.max(m,maxima[rowIndex(l,k,q)]);return m;}
  return maxima[rowIndex(l,h,q)];
}
function paint(ctx, id, l, h, q, alpha){
  const m=top(l,h,q), own=maxima[rowIndex(l,h,q)], off=rowIndex(l,h,q)*N;
  const k = m>0 ? own/m : 0;
  for(let n=0;n<N;n++){
    const c=lut[Math.min(255,Math.round(codes[off+n]*k))];
    id.data[4*n]=c[0];id.data[4*n+1]=c[1];id.data[4*n+2]=c[2];id.data[4*n+3]=alpha;
  }
  ctx.putImageData(id,0,0);
}
const bigData = cctx.createImageData(gw, gh);
window.vitvizBigPixels = ()=>Array.from(bigData.data);
window.vitvizValue = (l,h,q,n)=>value(l,h,q,n);
function drawBig(){
  paint(cctx, bigData, S.layer, S.head, S.query, 255);
  bctx.imageSmoothingEnabled=false;
  bctx.clearRect(0,0,big.width,big.height);
  if(S.opacity<1){bctx.globalAlpha=1;bctx.drawImage(img,0,0,big.width,big.height);}
  bctx.globalAlpha=S.opacity;
  bctx.drawImage(cell,0,0,big.width,big.height);
  bctx.globalAlpha=1;
  if(S.query>=P){
    const r=Math.floor((S.query-P)/gw), c=(S.query-P)%gw;
    bctx.strokeStyle="#00e5ff";bctx.lineWidth=3;
    bctx.strokeRect(c*big.width/gw, r*big.height/gh, big.width/gw, big.height/gh);
  }
  const m=top(S.layer,S.head,S.query);
  $("range").textContent=" 0 .. "+m.toPrecision(3)+(S.scale==="layer"?" (shared in the block)":" (this map)");
  let txt="";
  for(let p=0;p<P;p++) txt+=D.prefix[p]+": "+share[rowIndex(S.layer,S.head,S.query)*P+p].toFixed(4)+"  ";
  $("prefix").textContent = P ? ("Attention to prefix tokens (not on the image): "+txt) : "";
  showHover();
}
// the hovered cell's value, redrawn with the map (a click or a slider changes the value under the pointer)
let hoverCell=-1;
function showHover(){
  $("hover").textContent = hoverCell<0 ? "\u00a0" :
    tokenName(P+hoverCell)+": "+value(S.layer,S.head,S.query,hoverCell).toPrecision(3)+" (click: make it the query)";
}
function drawThumbs(){
  for(let l=0;l<L;l++)for(let h=0;h<H;h++){
    const t=thumbs[l*H+h];
    paint(t.ctx, t.data, l, h, S.query, 255);
    t.el.className = (l===S.layer&&h===S.head)?"sel":"";
  }
}
function syncControls(){
  $("layer").value=S.layer;$("head").value=S.head;
  $("layerv").textContent=D.layer_names[S.layer];$("headv").textContent=S.head;
  ensureOption(S.query);$("query").value=String(S.query);
}
function tokenName(q){if(q<P)return D.prefix[q];const n=q-P;return "patch ("+Math.floor(n/gw)+", "+(n%gw)+")";}
function ensureOption(q){
  const sel=$("query");
  if([...sel.options].some(o=>o.value===String(q)))return;
  const o=document.createElement("option");o.value=String(q);o.textContent=tokenName(q);sel.appendChild(o);
}
function redraw(what){
  const t0=performance.now();
  syncControls();
  if(what!=="big")drawThumbs(); else {
    for(let l=0;l<L;l++)for(let h=0;h<H;h++)thumbs[l*H+h].el.className=(l===S.layer&&h===S.head)?"sel":"";
  }
  drawBig();
  window.vitvizTimings.push(performance.now()-t0);
}
window.vitvizSet = function(changes){
  const q0=S.query, s0=S.scale; Object.assign(S, changes); redraw(S.query!==q0||S.scale!==s0?"all":"big");
};
function setup(){
  $("layer").max=L-1;$("head").max=H-1;
  const grid=$("thumbs");grid.style.gridTemplateColumns="auto repeat("+H+", 34px)";
  for(let l=0;l<L;l++){
    const lab=document.createElement("div");lab.className="lab";lab.textContent=D.layer_names[l];grid.appendChild(lab);
    for(let h=0;h<H;h++){
      const c=document.createElement("canvas");c.width=gw;c.height=gh;c.title=D.layer_names[l]+", head "+h;
      c.onclick=()=>window.vitvizSet({layer:l,head:h});
      grid.appendChild(c);
      const ctx=c.getContext("2d");
      thumbs.push({el:c,ctx:ctx,data:ctx.createImageData(gw,gh)});
    }
  }
  for(let q=0;q<P;q++)ensureOption(q);
  ensureOption(P+Math.floor(gh/2)*gw+Math.floor(gw/2));
  const bar=$("bar").getContext("2d"), bd=bar.createImageData(256,1);
  for(let i=0;i<256;i++){bd.data[4*i]=lut[i][0];bd.data[4*i+1]=lut[i][1];bd.data[4*i+2]=lut[i][2];bd.data[4*i+3]=255;}
  bar.putImageData(bd,0,0);
  const side=448, ar=gw/gh; big.width=ar>=1?side:Math.round(side*ar); big.height=ar>=1?Math.round(side/ar):side;
  $("layer").oninput=e=>window.vitvizSet({layer:+e.target.value});
  $("head").oninput=e=>window.vitvizSet({head:+e.target.value});
  $("query").onchange=e=>window.vitvizSet({query:+e.target.value});
  $("scale").onchange=e=>window.vitvizSet({scale:e.target.value});
  $("opacity").value=Math.round(S.opacity*100);
  $("opacity").oninput=e=>window.vitvizSet({opacity:e.target.value/100});
  function cellAt(e){const r=big.getBoundingClientRect();
    const c=Math.min(gw-1,Math.max(0,Math.floor((e.clientX-r.left)/r.width*gw)));
    const w=Math.min(gh-1,Math.max(0,Math.floor((e.clientY-r.top)/r.height*gh)));return w*gw+c;}
  big.onclick=e=>window.vitvizSet({query:P+cellAt(e)});
  big.onmousemove=e=>{hoverCell=cellAt(e);showHover();};
  big.onmouseleave=()=>{hoverCell=-1;showHover();};
  $("save").onclick=()=>{const a=document.createElement("a");a.download="head-view-"+D.layer_names[S.layer].replace(/\W+/g,"-")+"-head"+S.head+".png";a.href=big.toDataURL("image/png");a.click();};
}
(async function(){
  try{
    if(typeof DecompressionStream==="undefined")throw new Error("this browser cannot decompress the maps (no DecompressionStream)");
    codes=await inflate(D.maps); maxima=f32(await inflate(D.maxima)); share=f32(await inflate(D.prefix_share));
    await img.decode().catch(()=>{});
    setup(); redraw("all"); window.vitvizTimings=[];
    document.body.dataset.ready="1";
  }catch(err){$("err").textContent="The head view could not start: "+err.message;document.body.dataset.ready="error";}
})();
})();
</script></body></html>
"""
