#!/usr/bin/env python3
"""Cross-checks `coil convert` against llama.cpp's convert_hf_to_gguf.py on random checkpoints
of every supported family, made with transformers (other shapes and dtypes than the fixtures).

    python3 tools/crosscheck_converter.py LLAMA_CPP_TREE COIL_BINARY WORK_DIR

LLAMA_CPP_TREE: a llama.cpp source tree (e.g. the one vendored in the llama-cpp-python sdist).
Needs torch, transformers (5.x) and numpy. Applies the fixtures' shims to llama.cpp's converter:
the cut GPT-NeoX vocabulary's pre-tokenizer is "olmo", Jamba and Llama vocabularies go through the
GPT-2 BPE writer. Prints IDENTICAL or the differences per model.
"""
import json, os, shutil, subprocess, sys
import numpy as np
import torch
import transformers as T
import gguf

tree, coil, work = sys.argv[1:4]
here = os.path.dirname(os.path.abspath(__file__))
tok = os.path.join(here, "..", "tests", "fixtures", "hf", "mamba")
V = 4096
torch.manual_seed(0)

def save(name, model, dtype, edit=None):
    d = os.path.join(work, name, "hf")
    os.makedirs(d, exist_ok=True)
    model.to(dtype).save_pretrained(d)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(tok, f), d)
    if edit:
        p = os.path.join(d, "config.json")
        c = json.load(open(p))
        edit(c)
        json.dump(c, open(p, "w"), indent=1)
    return d

def llama_cpp_layer_types(c):
    c["layer_types"] = ["attention" if t == "full_attention" else "mamba" for t in c["layer_types"]]

models = {
    "mamba": lambda: save("mamba", T.MambaForCausalLM(T.MambaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, state_size=16, num_hidden_layers=3, time_step_rank=8, tie_word_embeddings=False)), torch.bfloat16),
    "falcon_mamba": lambda: save("falcon_mamba", T.FalconMambaForCausalLM(T.FalconMambaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, state_size=16, num_hidden_layers=2)), torch.float16),
    "mamba2": lambda: save("mamba2", T.Mamba2ForCausalLM(T.Mamba2Config(vocab_size=V, hidden_size=64, expand=2, head_dim=32, num_heads=4, n_groups=1, state_size=64, num_hidden_layers=3)), torch.float32),
    "jamba": lambda: save("jamba", T.JambaForCausalLM(T.JambaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1, expert_layer_period=2, mamba_dt_rank=8, use_mamba_kernels=False)), torch.bfloat16),
    "bamba": lambda: save("bamba", T.BambaForCausalLM(T.BambaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=32, attn_rotary_emb=8)), torch.float16),
    "granitemoehybrid": lambda: save("granitemoehybrid", T.GraniteMoeHybridForCausalLM(T.GraniteMoeHybridConfig(vocab_size=V, hidden_size=64, intermediate_size=32, shared_intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=32, embedding_multiplier=6.0, residual_multiplier=0.2, attention_multiplier=0.1, logits_scaling=4.0)), torch.bfloat16, llama_cpp_layer_types),
    "granite_dense": lambda: save("granite_dense", T.GraniteMoeHybridForCausalLM(T.GraniteMoeHybridConfig(vocab_size=V, hidden_size=64, intermediate_size=32, shared_intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, num_local_experts=0, num_experts_per_tok=0, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=32)), torch.float16, llama_cpp_layer_types),
    "falcon_h1": lambda: save("falcon_h1", T.FalconH1ForCausalLM(T.FalconH1Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_d_ssm=128, mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, attention_in_multiplier=0.7, attention_out_multiplier=1.3, ssm_in_multiplier=0.9, ssm_out_multiplier=1.1, key_multiplier=0.6, lm_head_multiplier=0.3, embedding_multiplier=5.0, mlp_multipliers=[0.8, 1.2], ssm_multipliers=[1.1, 0.9, 1.3, 0.7, 1.5])), torch.bfloat16),
    "nemotron_h_moe": lambda: save("nemotron_h_moe", T.NemotronHForCausalLM(T.NemotronHConfig(vocab_size=V, hidden_size=64, num_hidden_layers=4, layers_block_type=["mamba", "moe", "attention", "moe"], num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=4, mamba_head_dim=32, n_groups=1, ssm_state_size=32, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, moe_shared_expert_intermediate_size=64, n_shared_experts=1)), torch.float16),
    "llama": lambda: save("llama", T.LlamaForCausalLM(T.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)), torch.bfloat16),
}

shim = f"""
import sys, runpy
sys.path.insert(0, {tree!r} + '/gguf-py'); sys.path.insert(0, {tree!r})
import conversion.base as b, conversion.jamba as j, conversion.llama as l
b.TextModel.get_vocab_base_pre = lambda self, tok: "olmo"
j.JambaModel.set_vocab = lambda self: self._set_vocab_gpt2()
l.LlamaModel.set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = [{tree!r} + '/convert_hf_to_gguf.py'] + sys.argv[1:]
runpy.run_path({tree!r} + '/convert_hf_to_gguf.py', run_name='__main__')
"""
shim_path = os.path.join(work, "llama_cpp_convert.py")
os.makedirs(work, exist_ok=True)
open(shim_path, "w").write(shim)

def compare(a, b):
    ra, rb = gguf.GGUFReader(a), gguf.GGUFReader(b)
    ta = {t.name: t for t in ra.tensors}
    tb = {t.name: t for t in rb.tensors}
    out = []
    for n, x in ta.items():
        y = tb.get(n)
        if y is None:
            out.append("missing tensor " + n)
        elif list(x.shape) != list(y.shape) or x.tensor_type != y.tensor_type:
            out.append(f"{n}: {x.tensor_type.name}{list(x.shape)} vs {y.tensor_type.name}{list(y.shape)}")
        elif np.array(x.data).tobytes() != np.array(y.data).tobytes():
            out.append(f"{n}: data differs")
    out += ["extra tensor " + n for n in tb if n not in ta]
    for k, fa in ra.fields.items():
        if k.startswith("GGUF") or k == "general.name":
            continue
        fb = rb.fields.get(k)
        if fb is None:
            out.append("missing key " + k)
        elif [fa.parts[i].tobytes() for i in fa.data] != [fb.parts[i].tobytes() for i in fb.data]:
            out.append("key differs " + k)
    out += ["extra key " + k for k in rb.fields if k not in ra.fields]
    return out

for name, make in models.items():
    d = make()
    ref, ours = os.path.join(work, name + ".llama.gguf"), os.path.join(work, name + ".coil.gguf")
    r = subprocess.run([sys.executable, shim_path, d, "--outtype", "f16", "--outfile", ref], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{name}: llama.cpp's converter failed: {r.stderr.strip().splitlines()[-1]}")
        continue
    subprocess.run([coil, "convert", "--quiet", "--type", "f16", "-o", ours, d], check=True)
    diff = compare(ref, ours)
    print(f"{name}: " + ("IDENTICAL" if not diff else "; ".join(diff[:8])), flush=True)
