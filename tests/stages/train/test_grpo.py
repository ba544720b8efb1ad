"""stages/train/grpo.py, without a model: PPO clip bounds on both sides with both advantage
signs, importance weights and their cap, the k3 KL and its clamp, and the loss normalised over
the optimizer batch, as a hand-written reference computes it."""

import math
import random

import pytest

torch = pytest.importorskip("torch")

from stages.train import grpo  # noqa: E402
from stages.train.config import Config  # noqa: E402
from stages.train.samples import Sample  # noqa: E402

CFG = Config()  # clip_low 0.2 (ratio 0.8), clip_high 0.28 (ratio 1.28)


def token_loss(logp, old, sampled, adv, **cfg):
    return grpo.token_loss(torch, torch.tensor(logp, requires_grad=True), torch.tensor(old),
                           torch.tensor(sampled), torch.tensor(adv), Config(**cfg))


def test_asymmetric_clip_stops_the_gradient_outside_the_trust_region():
    logp = torch.log(torch.tensor([1.5, 1.1, 0.7, 0.9])).requires_grad_()
    loss, parts = grpo.token_loss(torch, logp, torch.zeros(4), torch.zeros(4),
                                  torch.tensor([1.0, 1.0, -1.0, -1.0]), CFG)
    loss.sum().backward()
    # ratio 1.5 > 1.28 with A>0 and ratio 0.7 < 0.8 with A<0 are clipped: no gradient
    assert logp.grad.tolist() == pytest.approx([0.0, -1.1, 0.0, 0.9])
    assert parts["clip_frac"] == 2.0


def test_tis_weights_clamp_at_the_cap():
    _, parts = token_loss([0.0, 0.0], [0.0, 0.0], [-5.0, -0.1], [1.0, 1.0], tis_cap=2.0)
    assert parts["tis_weight"] == pytest.approx(2.0 + torch.exp(torch.tensor(0.1)).item())
    assert parts["tis_clamped"] == 1.0


def loss_and_grad(ratio, advantage, old=0.0, sampled=None, **cfg):
    logp = torch.tensor([math.log(ratio) + old], dtype=torch.float64, requires_grad=True)
    loss, parts = grpo.token_loss(
        torch, logp, torch.tensor([old], dtype=torch.float64),
        torch.tensor([old if sampled is None else sampled], dtype=torch.float64),
        torch.tensor([advantage], dtype=torch.float64), Config(**cfg))
    loss.sum().backward()
    return float(loss.sum()), float(logp.grad[0]), parts


# (ratio, advantage) -> (loss, d loss / d logp, outside the bounds: clip_frac counts it)
@pytest.mark.parametrize("ratio,adv,loss,grad,clipped", [
    (0.7, 1.0, -0.7, -0.7, True),     # below 1 - clip_low, A > 0: pessimistic min keeps ratio
    (0.7, -1.0, 0.8, 0.0, True),      # below 1 - clip_low, A < 0: clipped at 0.8, no gradient
    (0.9, 1.0, -0.9, -0.9, False),    # inside
    (0.9, -1.0, 0.9, 0.9, False),
    (1.2, 1.0, -1.2, -1.2, False),    # inside, above 1 - clip_low + clip_low: not clipped yet
    (1.2, -1.0, 1.2, 1.2, False),
    (1.5, 1.0, -1.28, 0.0, True),     # above 1 + clip_high, A > 0: clipped at 1.28
    (1.5, -1.0, 1.5, 1.5, True),      # above 1 + clip_high, A < 0: ratio kept
])
def test_ppo_clip_bounds_on_both_sides_with_both_advantage_signs(ratio, adv, loss, grad, clipped):
    value, gradient, parts = loss_and_grad(ratio, adv)
    assert value == pytest.approx(loss) and gradient == pytest.approx(grad, abs=1e-12)
    assert parts["clip_frac"] == float(clipped)


def test_the_clip_bounds_follow_the_config():
    assert loss_and_grad(1.2, 1.0, clip_high=0.1)[0] == pytest.approx(-1.1)
    assert loss_and_grad(0.85, -1.0, clip_low=0.1)[0] == pytest.approx(0.9)


def test_importance_weights_scale_the_loss_and_are_capped():
    # exp(old - sampled) = e^0.5 scales the token; past the cap it is the cap
    value, grad, parts = loss_and_grad(1.0, 1.0, old=-1.0, sampled=-1.5)
    assert value == pytest.approx(-math.exp(0.5)) and grad == pytest.approx(-math.exp(0.5))
    assert parts["tis_weight"] == pytest.approx(math.exp(0.5)) and parts["tis_clamped"] == 0.0
    value, _, parts = loss_and_grad(1.0, 1.0, old=-1.0, sampled=-4.0, tis_cap=2.0)
    assert value == pytest.approx(-2.0) and parts["tis_weight"] == pytest.approx(2.0)
    assert parts["tis_clamped"] == 1.0
    _, _, parts = loss_and_grad(1.0, 1.0, old=-1.0, sampled=-1.0 - math.log(2.0) + 1e-9,
                                tis_cap=2.0)
    assert parts["tis_clamped"] == 0.0  # just under the cap is not clamped


def test_approx_kl_is_half_the_squared_log_ratio():
    _, _, parts = loss_and_grad(math.exp(0.4), 1.0)
    assert parts["approx_kl"] == pytest.approx(0.5 * 0.4 ** 2)


def test_approx_kl_and_the_tis_cap_with_a_moved_start_policy():
    _, _, parts = loss_and_grad(math.exp(0.4), 1.0, old=-2.0, sampled=-2.0)
    assert parts["approx_kl"] == pytest.approx(0.5 * 0.4 ** 2)
    _, _, parts = loss_and_grad(1.0, 1.0, old=-1.0, sampled=-1.0, tis_cap=1.0)
    assert parts["tis_clamped"] == 0.0 and parts["tis_weight"] == 1.0  # at the cap: not past it


@pytest.mark.parametrize("log_ratio", [50.0, -50.0, 100.0, 1e30])
def test_an_extreme_token_adds_exactly_the_clamp_to_the_kl_term(log_ratio):
    """slime's low_var_kl clamps k3 at 10: past it a token adds 10 and no gradient."""
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    anchored = torch.tensor([-1.0 + log_ratio, -1.0])  # the second token: policy = anchor
    kl = grpo.kl_k3(torch, logp, anchored)
    assert kl.tolist() == [10.0, 0.0] and grpo.KL_CLAMP == 10.0
    kl.sum().backward()
    assert logp.grad.tolist() == [0.0, 0.0]


def test_ordinary_tokens_keep_the_unclamped_k3_and_its_gradient():
    log_ratio = torch.linspace(-2.0, 2.0, 41, dtype=torch.float64)  # k3(2) = 4.39 < 10
    logp = torch.zeros(41, dtype=torch.float64, requires_grad=True)
    kl = grpo.kl_k3(torch, logp, log_ratio)
    expected_logp = torch.zeros(41, dtype=torch.float64, requires_grad=True)
    r = log_ratio - expected_logp
    expected = torch.exp(r) - r - 1
    torch.testing.assert_close(kl, expected, atol=0, rtol=0)
    kl.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(logp.grad, expected_logp.grad, atol=0, rtol=0)


def test_k3_kl_values():
    logp = torch.tensor([0.0, -1.0], dtype=torch.float64)
    anchored = torch.tensor([0.5, -1.0], dtype=torch.float64)
    kl = grpo.kl_k3(torch, logp, anchored)
    assert kl.tolist() == pytest.approx([math.exp(0.5) - 0.5 - 1, 0.0])
    # k3(-30) = 29 + e^-30: clamped to 10, as slime's low_var_kl is
    assert float(grpo.kl_k3(torch, torch.tensor([0.0]), torch.tensor([-30.0]))) == 10.0
    assert float(grpo.kl_k3(torch, torch.tensor([0.0]), torch.tensor([-5.0]))) == \
        pytest.approx(4.0 + math.exp(-5.0))


def reference_loss(samples, logp, old, cfg, norm):
    """The GRPO objective written out token by token, as the reference's trainer reduces it
    ("sample": slime's sum of per-sample token means over the batch size) or as TRL's dapo
    does ("token")."""
    per_sample, offset = [], 0
    for sample in samples:
        terms = []
        for k, sampled in enumerate(sample.sampled_logprobs):
            ratio = math.exp(logp[offset + k] - old[offset + k])
            tis = min(math.exp(old[offset + k] - sampled), cfg.tis_cap)
            clipped = min(max(ratio, 1 - cfg.clip_low), 1 + cfg.clip_high)
            terms.append(-tis * min(ratio * sample.advantage, clipped * sample.advantage))
        offset += len(sample.sampled_logprobs)
        per_sample.append(terms)
    if norm == "token":
        return sum(map(sum, per_sample)) / sum(map(len, per_sample))
    return sum(sum(t) / len(t) for t in per_sample) / len(per_sample)


@pytest.mark.parametrize("norm", grpo.LOSS_NORMS)
def test_loss_norms_match_a_hand_written_reference(norm):
    rng = random.Random(3)
    cfg = Config(loss_norm=norm)
    for _ in range(50):
        samples = []
        for i in range(rng.randrange(1, 6)):
            n = rng.randrange(1, 9)
            samples.append(Sample("agent", [0] * (n + 1), list(range(1, n + 1)),
                                  [rng.uniform(-3, 0) for _ in range(n)],
                                  rng.gauss(0, 2), source=f"play_{i}"))
        tokens = sum(len(s.loss_positions) for s in samples)
        logp = [rng.uniform(-3, 0) for _ in range(tokens)]
        old = [lp + rng.uniform(-0.5, 0.5) for lp in logp]
        terms, _ = grpo.token_loss(
            torch, torch.tensor(logp, dtype=torch.float64), torch.tensor(old, dtype=torch.float64),
            torch.tensor([v for s in samples for v in s.sampled_logprobs], dtype=torch.float64),
            torch.tensor([s.advantage for s in samples for _ in s.loss_positions],
                         dtype=torch.float64), cfg)
        weights = [w for s, w in zip(samples, grpo.loss_weights(samples, norm))
                   for _ in s.loss_positions]
        ours = float((terms * torch.tensor(weights, dtype=torch.float64)).sum())
        assert ours == pytest.approx(reference_loss(samples, logp, old, cfg, norm), abs=1e-12)


def test_sample_norm_weighs_every_episode_alike_however_long():
    short = Sample("agent", [0, 1], [1], [0.0], 1.0, source="a")
    long = Sample("agent", [0] * 11, list(range(1, 11)), [0.0] * 10, 1.0, source="b")
    turn_one, turn_two = (Sample("agent", [0] * 3, [1, 2], [0.0] * 2, 1.0, source="c")
                          for _ in range(2))
    assert grpo.loss_weights([short, long], "sample") == [1 / 2, 1 / 20]
    assert grpo.loss_weights([short, long], "token") == [1 / 11, 1 / 11]
    # a play trained turn by turn is still one sample: its turns share its weight
    assert grpo.loss_weights([short, turn_one, turn_two], "sample") == [1 / 2, 1 / 8, 1 / 8]


def sample(source, tokens, role="agent"):
    return Sample(role, [0] * (tokens + 1), list(range(1, tokens + 1)), [0.0] * tokens,
                  1.0, source=source)


def test_the_loss_is_normalised_over_the_optimizer_batch_not_a_micro_batch():
    batch = [sample("a", 3), sample("b", 1), sample("c", 4)]
    token = grpo.loss_weights(batch, "token")
    assert token == [1 / 8] * 3  # every token of the whole batch, whichever micro-batch
    assert sum(w * len(s.loss_positions) for s, w in zip(batch, token)) == pytest.approx(1.0)
    per_sample = grpo.loss_weights(batch, "sample")
    assert per_sample == pytest.approx([1 / 9, 1 / 3, 1 / 12])
    assert sum(w * len(s.loss_positions) for s, w in zip(batch, per_sample)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="loss_norm must be one of sample, token"):
        grpo.loss_weights(batch, "micro")
