#!/usr/bin/env python3
"""Writes a random Hugging Face model directory (config.json +
safetensors, as save_pretrained writes them) for the pretrained-backbone
tests and examples: every parameter random (norm weights and biases
included, so a name mapped to the wrong tensor shows), nothing downloaded.
Runs with the project's venv (scripts/setup.sh installs transformers).

    scripts/make-hf-model.py OUT --family gpt2|llama|bert|roberta
        [--layers 2 --hidden 64 --heads 4 --ffn 256 --vocab 256
         --positions 64] [--kv-heads 2 --rope-scaling --bias]  (llama)
        [--dtype f32|bf16|f16] [--shard-bytes N] [--task-model] [--seed S]
"""
import argparse

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--family", default="gpt2",
                    choices=["gpt2", "llama", "bert", "roberta"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2,
                    help="llama: key/value heads (grouped-query attention)")
    ap.add_argument("--rope-scaling", action="store_true",
                    help="llama: llama3 rope scaling")
    ap.add_argument("--bias", action="store_true",
                    help="llama: attention and MLP biases")
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--positions", type=int, default=64)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    ap.add_argument("--shard-bytes", type=int, default=0,
                    help="save as shards of at most this many bytes")
    ap.add_argument("--task-model", action="store_true",
                    help="save the LM-head model (prefixed names)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(a.seed)
    if a.family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=a.vocab, n_positions=a.positions, n_embd=a.hidden,
            n_layer=a.layers, n_head=a.heads, n_inner=a.ffn,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=0, eos_token_id=0)
        cls = (transformers.GPT2LMHeadModel if a.task_model
               else transformers.GPT2Model)
    elif a.family in ("bert", "roberta"):
        common = dict(vocab_size=a.vocab, hidden_size=a.hidden,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      intermediate_size=a.ffn, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
        if a.family == "bert":
            config = transformers.BertConfig(max_position_embeddings=a.positions,
                                             **common)
            cls = (transformers.BertForMaskedLM if a.task_model
                   else transformers.BertModel)
        else:
            # RoBERTa's positions start after its padding id (1).
            config = transformers.RobertaConfig(
                max_position_embeddings=a.positions + 2, type_vocab_size=1,
                pad_token_id=1, bos_token_id=0, eos_token_id=2, **common)
            cls = (transformers.RobertaForMaskedLM if a.task_model
                   else transformers.RobertaModel)
    else:
        rope = {"rope_type": "default", "rope_theta": 500000.0}
        if a.rope_scaling:
            # Scaled below the sequence length, so every band (low, medium,
            # high frequency) is exercised.
            rope = {"rope_type": "llama3", "rope_theta": 500000.0,
                    "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16}
        config = transformers.LlamaConfig(
            vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
            num_hidden_layers=a.layers, num_attention_heads=a.heads,
            num_key_value_heads=a.kv_heads, max_position_embeddings=a.positions,
            rope_parameters=rope, attention_bias=a.bias, mlp_bias=a.bias,
            bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = (transformers.LlamaForCausalLM if a.task_model
               else transformers.LlamaModel)
    model = cls(config)
    with torch.no_grad():
        # The family's own initializer range for the matrices (activations
        # of the size trained models have), and every vector random too.
        for name, p in model.named_parameters():
            noise = torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.02)
            norm_weight = (".ln_" in "." + name or "norm" in name.lower()) \
                and name.endswith("weight")
            p.copy_(noise + 1.0 if norm_weight else noise)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    model = model.to(dtype)
    kwargs = {}
    if a.shard_bytes:
        kwargs["max_shard_size"] = a.shard_bytes
    model.save_pretrained(a.out, **kwargs)


if __name__ == "__main__":
    main()
