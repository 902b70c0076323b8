"""A stand-in inference engine that loads weights the way vLLM and SGLang
do, for the weight-sync recipe (docs/rl-weight-sync.md).

Its Llama-style layers hold *fused* parameters: ``qkv_proj`` (the rows of
``q_proj``, ``k_proj`` and ``v_proj``) and ``gate_up_proj`` (``gate_proj``,
``up_proj``), and ``load_weights(iterable of (name, tensor))`` maps the
trainer's Hugging Face names onto them with a stacked-params table, as
vLLM's ``LlamaForCausalLM.load_weights`` does; ``lm_head.weight`` is tied
to the embedding and skipped.  Feed it ``Receiver.named_tensors(msg)``,
or let ``Receiver.serve(channel, load_weights=engine.load_weights)`` do
it for every bucket of a sync::

    engine = Engine(layers=2, hidden=64, device="cuda")
    receiver = Receiver()
    receiver.serve(channel, load_weights=engine.load_weights)

For the one-copy mode the engine exports ``Engine.targets()`` instead
(its weights allocated inside ``allocconf.ipc_safe()``, so that classic
CUDA IPC can share them) and the trainer writes straight into them::

    with allocconf.ipc_safe():
        engine = Engine(layers=2, hidden=64, device="cuda")
    targets = Targets(engine.targets())
    targets.serve(channel)            # the trainer: Writer().sync(...)

``hf_weights()`` makes the matching Hugging Face state dict (with the tied
``lm_head.weight``) for a trainer, and ``Engine.matches()`` checks an
engine against it, value for value.
"""
from typing import Dict, Iterable, Set, Tuple

import torch

# (fused parameter, the Hugging Face part it stacks, which shard) as in
# vLLM's Llama.
STACKED = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)


def _shapes(hidden: int) -> Tuple[int, int, int]:
    """(query rows, key/value rows, MLP width) of a small GQA layer."""
    return hidden, hidden // 2, 2 * hidden


class Engine:
    """Fused Llama-style parameters, zeros until loaded."""

    def __init__(self, layers: int, hidden: int, vocab: int = 64,
                 dtype: torch.dtype = torch.float32,
                 device: str = "cpu") -> None:
        q, kv, inter = _shapes(hidden)
        self.shards = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv),
                       0: (0, inter), 1: (inter, inter)}

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        p: Dict[str, torch.Tensor] = {
            "model.embed_tokens.weight": zeros(vocab, hidden)}
        for i in range(layers):
            pre = f"model.layers.{i}."
            p[pre + "self_attn.qkv_proj.weight"] = zeros(q + 2 * kv, hidden)
            p[pre + "self_attn.o_proj.weight"] = zeros(hidden, q)
            p[pre + "mlp.gate_up_proj.weight"] = zeros(2 * inter, hidden)
            p[pre + "mlp.down_proj.weight"] = zeros(hidden, inter)
            p[pre + "input_layernorm.weight"] = zeros(hidden)
            p[pre + "post_attention_layernorm.weight"] = zeros(hidden)
        p["model.norm.weight"] = zeros(hidden)
        self.params = p

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]
                     ) -> Set[str]:
        """Copy each (Hugging Face name, tensor) into its parameter, the
        stacked ones into their rows; returns the names loaded."""
        loaded: Set[str] = set()
        with torch.no_grad():
            for name, w in weights:
                if name == "lm_head.weight":
                    continue  # tied to the embedding
                for fused, part, shard in STACKED:
                    if part in name:
                        start, rows = self.shards[shard]
                        target = self.params[name.replace(part, fused)]
                        target[start:start + rows].copy_(w)
                        break
                else:
                    self.params[name].copy_(w)
                loaded.add(name)
        return loaded

    def targets(self) -> Dict[str, torch.Tensor]:
        """For the one-copy mode (allocconf.transfer.Targets): each
        Hugging Face name the trainer sends, and the engine tensor it
        lands in: the stacked ones as the rows of their fused parameter,
        as ``load_weights`` puts them; the tied ``lm_head.weight`` not at
        all (the trainer's copy of the embedding is written once)."""
        out: Dict[str, torch.Tensor] = {}
        for name, param in self.params.items():
            stacked = [(fused, part, shard) for fused, part, shard in STACKED
                       if fused in name]
            if not stacked:
                out[name] = param
            for fused, part, shard in stacked:
                start, rows = self.shards[shard]
                out[name.replace(fused, part)] = param[start:start + rows]
        return out

    def matches(self, hf: Dict[str, torch.Tensor]) -> bool:
        """Whether every parameter holds what `hf` says, bit for bit."""
        for name, w in hf.items():
            if name == "lm_head.weight":
                continue
            got = self.params.get(name)
            for fused, part, shard in STACKED:
                if part in name:
                    start, rows = self.shards[shard]
                    got = self.params[name.replace(part, fused)][
                        start:start + rows]
                    break
            if got is None or not torch.equal(got.cpu(), w.cpu()):
                return False
        return True


def hf_weights(layers: int, hidden: int, vocab: int = 64, seed: int = 0,
               dtype: torch.dtype = torch.float32,
               device: str = "cpu") -> Dict[str, torch.Tensor]:
    """A Hugging Face Llama-style state dict for Engine(layers, hidden,
    vocab), random, with lm_head.weight tied to the embedding."""
    q, kv, inter = _shapes(hidden)
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    w: Dict[str, torch.Tensor] = {"model.embed_tokens.weight":
                                  rand(vocab, hidden)}
    for i in range(layers):
        pre = f"model.layers.{i}."
        w[pre + "self_attn.q_proj.weight"] = rand(q, hidden)
        w[pre + "self_attn.k_proj.weight"] = rand(kv, hidden)
        w[pre + "self_attn.v_proj.weight"] = rand(kv, hidden)
        w[pre + "self_attn.o_proj.weight"] = rand(hidden, q)
        w[pre + "mlp.gate_proj.weight"] = rand(inter, hidden)
        w[pre + "mlp.up_proj.weight"] = rand(inter, hidden)
        w[pre + "mlp.down_proj.weight"] = rand(hidden, inter)
        w[pre + "input_layernorm.weight"] = rand(hidden)
        w[pre + "post_attention_layernorm.weight"] = rand(hidden)
    w["model.norm.weight"] = rand(hidden)
    w["lm_head.weight"] = w["model.embed_tokens.weight"]  # tied
    return w
