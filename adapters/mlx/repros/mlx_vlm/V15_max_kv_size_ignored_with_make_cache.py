"""V15 (upstream-bug): make_prompt_cache(model, max_kv_size=W) returns model.make_cache()
whenever the model defines it (mlx-vlm's llama and gemma4_text do) and drops W: the
full-attention layers stay unbounded KVCaches, so a request's cache grows past W. The same
code as mlx-lm's (mlx-lm issue 118; mlx-vlm PR 2195 closed unmerged)."""
import mlx.core as mx
from mlx_vlm.models.cache import KVCache, make_prompt_cache
from mlx_vlm.models.llama import Model, ModelConfig

cfg = ModelConfig(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256)
lm = Model(cfg).language_model
cache = make_prompt_cache(lm, max_kv_size=20)
lm(mx.array([list(range(37))]), cache=cache)
held = [c.offset for c in cache]
print("max_kv_size=20, 37 tokens:", [type(c).__name__ for c in cache], "hold", held)
assert all(type(c) is KVCache for c in cache) and max(held) > 20, "max_kv_size bounded the cache"
