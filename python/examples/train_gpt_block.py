"""Train a small GPT twice from the same initialisation on the same batches, once with
flashattn.attention and once with torch.nn.functional.scaled_dot_product_attention, both under
torch.compile(fullgraph=True), and compare the losses step by step.

    python python/examples/train_gpt_block.py                      # CUDA in bf16 if present, else CPU fp32
    python python/examples/train_gpt_block.py --steps 20 --seqlen 1024

Exits non-zero if a step's losses differ by more than the tolerance (bf16: 2% relative, fp32: 1e-4)
or if training did not lower the loss. The task is to continue a random 8-token motif that repeats
along the sequence; attention learns it within about a hundred steps. Around the step where the
loss drops, tiny numerical differences grow (the two float32 runs then differ by ~1e-4 instead of
~1e-7), so the default 40 steps compare the runs before that point.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

import flashattn


def flash_causal(q, k, v):
    """q, k, v: [batch, seqlen, heads, head_dim] views of the qkv projection."""
    return flashattn.attention(q, k, v, causal=True)


def sdpa_causal(q, k, v):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


class Block(torch.nn.Module):
    def __init__(self, width, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x):
        batch, seqlen, width = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, seqlen, 3, self.heads, width // self.heads)
        attended = self.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]).reshape(batch, seqlen, width)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab, width, heads, layers, seqlen, attention):
        super().__init__()
        self.embed, self.position = torch.nn.Embedding(vocab, width), torch.nn.Embedding(seqlen, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads, attention) for _ in range(layers))
        self.norm, self.head = torch.nn.LayerNorm(width), torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


MOTIF = 8  # tokens; each sequence repeats a random motif, so a token is predictable from 8 back


def batches(args, device):
    g = torch.Generator().manual_seed(1)
    for _ in range(args.steps):
        motif = torch.randint(0, args.vocab, (args.batch, MOTIF), generator=g)
        tokens = motif.repeat(1, args.seqlen // MOTIF + 2)[:, :args.seqlen + 1]
        yield tokens.to(device)


def train(attention, args, device, dtype):
    torch.manual_seed(0)
    model = GPT(args.vocab, args.width, args.heads, args.layers, args.seqlen, attention).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    compiled = torch.compile(model, fullgraph=True, backend=args.compile_backend)
    losses, start = [], None
    for step, tokens in enumerate(batches(args, device)):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = compiled(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step == 1:  # the first steps compile
            start = time.perf_counter()
    seconds_per_step = (time.perf_counter() - start) / max(1, args.steps - 2)
    return losses, seconds_per_step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--compile-backend", default="inductor")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tolerance = 0.02 if dtype == torch.bfloat16 else 1e-4

    flash_losses, flash_time = train(flash_causal, args, device, dtype)
    sdpa_losses, sdpa_time = train(sdpa_causal, args, device, dtype)
    worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(flash_losses, sdpa_losses))
    for step, (a, b) in enumerate(zip(flash_losses, sdpa_losses)):
        print(f"step {step:3d}  flashattn {a:.4f}  sdpa {b:.4f}")
    summary = {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "steps": args.steps,
               "first_loss": flash_losses[0], "last_loss_flashattn": flash_losses[-1],
               "last_loss_sdpa": sdpa_losses[-1], "max_relative_loss_difference": worst, "tolerance": tolerance,
               "ms_per_step_flashattn": 1e3 * flash_time, "ms_per_step_sdpa": 1e3 * sdpa_time}
    print(json.dumps(summary))
    learned = flash_losses[-1] < flash_losses[0]
    if not (worst <= tolerance and learned and all(math.isfinite(x) for x in flash_losses)):
        print("FAILED: losses differ beyond the tolerance, or the model did not learn", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
