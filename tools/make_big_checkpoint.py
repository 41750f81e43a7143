#!/usr/bin/env python3
"""Writes a random Mamba-2 Hugging Face checkpoint (sharded safetensors) for
measuring `coil convert`'s memory use: d_model 1536, 24 layers, d_state 128,
vocab 50288, float32 by default (~1.7 GB) — tensors are streamed to disk one
at a time, so this script itself stays small.

    python3 tools/make_big_checkpoint.py OUT_DIR [--dtype f32|f16|bf16] [--tokenizer-from DIR]
"""
import argparse, json, os, shutil, struct
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
p.add_argument("--layers", type=int, default=24)
p.add_argument("--d-model", type=int, default=1536)
p.add_argument("--tokenizer-from", default=None, help="copy tokenizer.json / tokenizer_config.json from here")
a = p.parse_args()

d, L, N, G, hd, V = a.d_model, a.layers, 128, 1, 64, 50288
di = 2 * d
H = di // hd
conv_dim = di + 2 * G * N
shapes = {"backbone.embeddings.weight": [V, d], "backbone.norm_f.weight": [d]}
for i in range(L):
    pre = f"backbone.layers.{i}."
    shapes.update({
        pre + "norm.weight": [d],
        pre + "mixer.A_log": [H], pre + "mixer.D": [H], pre + "mixer.dt_bias": [H],
        pre + "mixer.conv1d.weight": [conv_dim, 1, 4], pre + "mixer.conv1d.bias": [conv_dim],
        pre + "mixer.in_proj.weight": [2 * di + 2 * G * N + H, d],
        pre + "mixer.norm.weight": [di], pre + "mixer.out_proj.weight": [d, di],
    })
st_dtype = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[a.dtype]
esize = 4 if a.dtype == "f32" else 2
names = sorted(shapes)
shards = [names[: len(names) // 2], names[len(names) // 2:]]
os.makedirs(a.out, exist_ok=True)
rng = np.random.default_rng(0)
weight_map = {}

def encode(x):
    x = x.astype(np.float32)
    if a.dtype == "f32":
        return x.tobytes()
    if a.dtype == "f16":
        return x.astype(np.float16).tobytes()
    return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()

for k, part in enumerate(shards):
    fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
    header, off = {}, 0
    for n in part:
        size = int(np.prod(shapes[n])) * esize
        header[n] = {"dtype": st_dtype, "shape": shapes[n], "data_offsets": [off, off + size]}
        off += size
        weight_map[n] = fname
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(a.out, fname), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for n in part:
            shape = shapes[n]
            fan_in = shape[-1] if len(shape) > 1 else 1
            if n.endswith("A_log"):
                x = np.log(np.arange(1, shape[0] + 1, dtype=np.float32))
            elif n.endswith(("norm.weight", ".D")):
                x = np.ones(shape, np.float32)
            else:
                x = rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)
            f.write(encode(x))
with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
cfg = {"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": d,
       "num_hidden_layers": L, "state_size": N, "n_groups": G, "head_dim": hd, "num_heads": H,
       "expand": 2, "conv_kernel": 4, "vocab_size": V, "layer_norm_epsilon": 1e-5,
       "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1}
with open(os.path.join(a.out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
if a.tokenizer_from:
    for n in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(a.tokenizer_from, n), a.out)
print(a.out, sum(int(np.prod(s)) for s in shapes.values()), "parameters")
