"""X13 (representation): vllm-mlx's scheduler bounds a request's cache under max_kv_size
(SchedulerConfig.max_kv_size, the serve flag --max-kv-size) with
RotatingKVCache(max_size=W) and keep=0 (scheduler.py Scheduler._bound_cache_layers): a
pure rolling window. mlx-lm's single-request max_kv_size (make_prompt_cache, the policy
kvlab's goldens take) keeps the first 4 tokens (keep=4) as attention sinks. mlx-lm's
BatchGenerator cannot batch a ring with keep tokens (generate.py: "RotatingKVCache with
keep tokens is not supported"), so keep=0 is what continuous batching can run. The two
agree until the window first drops a token and differ from there: the scheduler's logits
equal mlx-lm generate_step's on RotatingKVCache(W, keep=0), not on keep=4."""
import sys
import types

try:
    import transformers  # noqa: F401
except ImportError:  # the pinned venv installs vllm-mlx --no-deps: tokenizers are not needed here
    class _Tok:
        @classmethod
        def register(cls, *a, **k):
            pass
    sys.modules["transformers"] = types.SimpleNamespace(AutoTokenizer=_Tok, PreTrainedTokenizerFast=_Tok,
                                                        PreTrainedTokenizer=_Tok)
    sys.modules.setdefault("huggingface_hub", types.SimpleNamespace(snapshot_download=None))

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache
from mlx_lm.models.llama import Model, ModelArgs
from vllm_mlx.request import Request, SamplingParams
from vllm_mlx.scheduler import Scheduler, SchedulerConfig

W, PROMPT, STEPS = 20, [(7 * j + 3) % 256 for j in range(13)], 12
mx.random.seed(0)
model = Model(ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256))
mx.eval(model.parameters())


class Tokenizer:  # token ids in, no EOS
    eos_token_id = None
    clean_up_tokenization_spaces = False

    def decode(self, ids, **kw):
        return ""


bound = Scheduler._bound_cache_layers(model.make_cache(), W)
print("scheduler's bounded cache:", [(type(c).__name__, c.max_size, c.keep) for c in bound])
assert all(type(c) is RotatingKVCache and c.max_size == W and c.keep == 0 for c in bound)

rows = []
sched = Scheduler(model, Tokenizer(), SchedulerConfig(max_kv_size=W, enable_prefix_cache=False))
sched.add_request(Request("r", PROMPT, SamplingParams(max_tokens=STEPS, temperature=0.0,
                                                      logits_processors=[lambda t, l: rows.append(l[0]) or l])))
while sched.has_requests():
    sched.step()
rows = mx.stack(rows[:STEPS])


def generate(keep):
    got = []
    cache = [RotatingKVCache(max_size=W, keep=keep) for _ in model.layers]
    for _ in generate_step(mx.array(PROMPT), model, max_tokens=STEPS, prompt_cache=cache,
                           sampler=lambda lp: mx.argmax(lp, axis=-1),
                           logits_processors=[lambda t, l: got.append(l[0]) or l]):
        pass
    return mx.stack(got[:STEPS])


first_drop = W - len(PROMPT) + 1  # step s's call holds len(PROMPT) + s tokens
for keep in (0, 4):
    d = mx.abs(rows - generate(keep)).max(axis=-1).tolist()
    print(f"max |dlogit| per step, scheduler vs generate_step keep={keep}:", [f"{x:.1e}" for x in d])
    if keep == 0:
        assert max(d) < 1e-4, "the scheduler's window is not keep=0's"
    else:
        assert max(d[:first_drop]) < 1e-4 and max(d[first_drop:]) > 1e-3, "keep=4 does not part where the window drops"
