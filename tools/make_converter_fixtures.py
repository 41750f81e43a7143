#!/usr/bin/env python3
"""Makes tests/fixtures/convert/: tiny checkpoints for the converter's deviations from
llama.cpp (Nemotron-H mixing MLP and MoE layers; GraniteMoeHybrid with RoPE), float16, with
transformers float32 logits for the first 16 fixture tokens.

    python3 tools/make_converter_fixtures.py tests/fixtures/convert
"""
import torch, json, os, shutil, sys, numpy as np
import transformers as T
out = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
tok = os.path.join(here, '..', 'tests', 'fixtures', 'hf', 'mamba')
tokens = json.load(open(os.path.join(here, '..', 'tests', 'fixtures', 'models', 'mamba', 'tokens.json')))[:16]
def save(name, model, edit=None):
    d = os.path.join(out, name); os.makedirs(d, exist_ok=True)
    model = model.float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():  # unit-variance activations, as the fixtures
            if 'A_log' in n or 'dt_bias' in n or 'conv1d' in n:
                continue
            if 'embed' in n:
                p.normal_(0, 1.0)
            elif 'lm_head' in n:
                p.normal_(0, 4.0 / p.shape[-1] ** 0.5)
            elif p.dim() >= 2:
                p.normal_(0, 1.0 / p.shape[-1] ** 0.5)
            elif n.endswith('.D'):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif 'norm' in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
        for p in model.parameters():  # f16-exact values, saved as f16 below
            p.copy_(p.half().float())
        logits = model(torch.tensor([tokens]), use_cache=False, position_ids=torch.arange(len(tokens))[None]).logits[0].float().numpy()
    model.half().save_pretrained(d)
    for f in ['tokenizer.json', 'tokenizer_config.json']: shutil.copy(os.path.join(tok, f), d)
    if edit:
        p = os.path.join(d, 'config.json'); c = json.load(open(p)); edit(c); json.dump(c, open(p, 'w'), indent=1)
    np.save(os.path.join(d, 'logits.npy'), logits.astype(np.float32))
    json.dump(tokens, open(os.path.join(d, 'tokens.json'), 'w'))
torch.manual_seed(5)
def tlim(c): c['time_step_limit'] = [0.0, {"__float__": "Infinity"}]
def zero_tmin(m):
    m.config.time_step_min = 0.0
    for mod in m.modules():
        if hasattr(mod, 'time_step_limit'):
            mod.time_step_limit = (0.0, float('inf'))
    return m
save('nemotron_h_mixed', zero_tmin(T.NemotronHForCausalLM(T.NemotronHConfig(vocab_size=4096, hidden_size=32, num_hidden_layers=5, layers_block_type=['mamba', 'mlp', 'attention', 'moe', 'mamba'], num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, moe_shared_expert_intermediate_size=32, n_shared_experts=1, chunk_size=8))), tlim)
torch.manual_seed(6)
save('granite_rope', T.GraniteMoeHybridForCausalLM(T.GraniteMoeHybridConfig(vocab_size=4096, hidden_size=32, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, layer_types=['mamba', 'attention', 'mamba'], mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=8, position_embedding_type='rope', time_step_limit=(0.0, float('inf')))), tlim)
print('ok')
