"""Distributions and network helpers."""

import math

import pytest
import torch

from agents.nets import Categorical, DiagGaussian, RecurrentEncoder, TanhGaussian, mlp, polyak_update
from agents.nets.recurrent import unroll


def test_tanh_gaussian_log_prob_matches_change_of_variables():
    torch.manual_seed(0)
    mean, log_std = torch.randn(64, 3), torch.randn(64, 3) * 0.5
    dist = TanhGaussian(mean, log_std)
    actions, log_probs = dist.rsample_with_log_prob()
    assert actions.abs().max() < 1
    # log p(a) = log N(u) - sum log(1 - tanh(u)^2), with u = atanh(a)
    u = torch.atanh(actions.double())
    normal = torch.distributions.Normal(mean.double(), log_std.double().exp())
    reference = (normal.log_prob(u) - torch.log1p(-(torch.tanh(u) ** 2))).sum(-1)
    torch.testing.assert_close(log_probs.double(), reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dist.log_prob(actions).double(), reference, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(dist.mode(), torch.tanh(mean))


def test_tanh_gaussian_log_prob_finite_when_saturated():
    dist = TanhGaussian(torch.full((2, 1), 30.0), torch.zeros(2, 1))
    _, log_probs = dist.rsample_with_log_prob()
    assert torch.isfinite(log_probs).all()


def test_diag_gaussian_sums_over_dimensions():
    dist = DiagGaussian(torch.zeros(5, 2), torch.zeros(2))
    torch.testing.assert_close(dist.log_prob(torch.zeros(5, 2)), torch.full((5,), -math.log(2 * math.pi)))
    torch.testing.assert_close(dist.entropy(), torch.full((5,), 1 + math.log(2 * math.pi)))


def test_categorical_mode_and_log_prob():
    dist = Categorical(torch.tensor([[0.0, 2.0, 1.0]]))
    assert dist.mode().tolist() == [1]
    torch.testing.assert_close(dist.log_prob(torch.tensor([1])), torch.log_softmax(torch.tensor([0.0, 2.0, 1.0]), 0)[1:2])


def test_categorical_inverse_cdf_samples_follow_the_probabilities():
    probabilities = torch.tensor([0.2, 0.5, 0.3])
    dist = Categorical(probabilities.log().expand(200_000, 3))
    generator = torch.Generator().manual_seed(0)
    noise = dist.draw_noise(generator)
    assert noise.shape == (200_000,) and 0 <= noise.min() and noise.max() < 1
    frequencies = torch.bincount(dist.sample(noise), minlength=3) / 200_000
    torch.testing.assert_close(frequencies, probabilities, atol=5e-3, rtol=0)
    # the uniforms map to actions through the cumulative probabilities 0.2, 0.7, 1.0
    edges = Categorical(probabilities.log().expand(4, 3))
    assert edges.sample(torch.tensor([0.0, 0.19, 0.21, 0.999])).tolist() == [0, 0, 1, 2]


def test_sampling_with_noise_is_a_function_of_the_noise_and_keeps_leading_dims():
    """The same draws give the same actions, and a (seeds, batch) distribution samples each
    seed's rows from that seed's noise alone."""
    mean, log_std = torch.randn(3, 4, 2), torch.randn(3, 4, 2) * 0.3
    tanh_dist, gaussian = TanhGaussian(mean, log_std), DiagGaussian(mean, log_std)
    noise = torch.stack([TanhGaussian(mean[s], log_std[s]).draw_noise(torch.Generator().manual_seed(s)) for s in range(3)])
    actions, log_probs = tanh_dist.rsample_with_log_prob(noise)
    assert actions.shape == (3, 4, 2) and log_probs.shape == (3, 4)
    for seed in range(3):
        alone = TanhGaussian(mean[seed], log_std[seed])
        seed_actions, seed_log_probs = alone.rsample_with_log_prob(alone.draw_noise(torch.Generator().manual_seed(seed)))
        torch.testing.assert_close(actions[seed], seed_actions)
        torch.testing.assert_close(log_probs[seed], seed_log_probs)
    torch.testing.assert_close(gaussian.sample(noise), mean + log_std.exp() * noise)
    torch.testing.assert_close(tanh_dist.sample(noise), torch.tanh(mean + log_std.exp() * noise))
    torch.testing.assert_close(gaussian.sample_with_log_prob(noise)[1], gaussian.log_prob(gaussian.sample(noise)))


def test_polyak_update_moves_target_by_tau():
    source, target = mlp(2, [4], 1), mlp(2, [4], 1)
    before = [p.clone() for p in target.parameters()]
    polyak_update(target, source, 0.25)
    for old, new, src in zip(before, target.parameters(), source.parameters()):
        torch.testing.assert_close(new, 0.75 * old + 0.25 * src)


def test_orthogonal_init_scales_output_layer():
    net = mlp(8, [64, 64], 2, "tanh", orthogonal_init=True, output_gain=0.01)
    assert net[-1].weight.abs().max() < 0.05 and net[-1].bias.abs().max() == 0


def test_policy_and_value_is_forward_with_the_log_std_broadcast():
    """The update's distribution (log-std (d,) broadcast) gives the same log-probs, entropies,
    KLs and gradients as the one rebuilt from forward's stored parameters (log-std per row)."""
    from agents.envs import env_spec
    from agents.nets.policies import ActorCritic

    torch.manual_seed(0)
    network = ActorCritic(env_spec("HalfCheetah-v5"), initial_log_std=-0.5)
    with torch.no_grad():
        network.log_std.copy_(torch.linspace(-1.0, 0.5, 6))
    obs, actions = torch.randn(32, 17), torch.randn(32, 6)
    old = network.distribution(network(obs)[0].detach() + 0.1)

    def objective(dist):
        return (dist.log_prob(actions) + dist.entropy() - old.kl(dist)).mean()

    params, values, _ = network(obs)
    stored = network.distribution(params)
    direct, direct_values, _ = network.policy_and_value(obs)
    assert torch.equal(values, direct_values) and direct.entropy().shape == (32,)
    torch.testing.assert_close(direct.log_prob(actions), stored.log_prob(actions))
    torch.testing.assert_close(direct.entropy(), stored.entropy())
    torch.testing.assert_close(old.kl(direct), old.kl(stored))
    gradients = [torch.autograd.grad(objective(dist), list(network.parameters()), allow_unused=True) for dist in (stored, network.policy_and_value(obs)[0])]
    for a, b in zip(*gradients):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("extractor", [(), (5,)])
def test_stacked_unroll_equals_stepping_each_cell_with_resets(kind, extractor):
    """Two memories unrolled as one stacked cell give the states, gradients and second
    derivatives of stepping each torch cell on its own, zeroing the state where an episode
    starts (a GRU's hand-written backward pass included)."""
    torch.manual_seed(0)
    memories = [RecurrentEncoder(3, extractor, "tanh", kind, 4).double() for _ in range(2)]
    steps, batch = 6, 5
    obs = torch.randn(steps, batch, 3, dtype=torch.float64)
    resets = torch.zeros(steps, batch, dtype=torch.bool)
    resets[2, 1] = resets[4, 0] = resets[4, 3] = True
    hidden = torch.randn(2, batch, memories[0].state_size, dtype=torch.float64)

    parameters = [p for m in memories for p in m.parameters()]
    hidden.requires_grad_(True)
    direction = [torch.randn_like(p) for p in [*parameters, hidden]]

    def derivatives(states: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """First derivatives of a loss, and the second along ``direction`` (a Hessian-vector
        product, as TRPO's Fisher-vector products take), w.r.t. the parameters and the initial state."""
        loss = (states.square() * torch.linspace(0.5, 1.5, states.shape[-1], dtype=states.dtype)).sum()
        first = torch.autograd.grad(loss, [*parameters, hidden], create_graph=True)
        second = torch.autograd.grad(sum((g * v).sum() for g, v in zip(first, direction)), [*parameters, hidden])
        return first, second

    stacked = unroll(memories, obs, hidden, resets)  # (L, K, B, S)
    stacked_grads = derivatives(stacked)
    # the plain backward pass (no second derivative to follow) gives the same first derivatives
    plain = torch.autograd.grad(
        unroll(memories, obs, hidden, resets).square().mul(torch.linspace(0.5, 1.5, stacked.shape[-1], dtype=stacked.dtype)).sum(), [*parameters, hidden]
    )

    stepped = []
    for memory, state in zip(memories, hidden):
        states = []
        for t in range(steps):
            state = torch.where(resets[t, :, None], 0.0, state)
            state = memory.step(obs[t], state)[1]
            states.append(state)
        stepped.append(torch.stack(states))
    reference = torch.stack(stepped, dim=1)
    reference_grads = derivatives(reference)

    torch.testing.assert_close(stacked, reference)
    for got, expected in zip(stacked_grads, reference_grads):
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e)
    for g, e in zip(plain, reference_grads[0]):
        torch.testing.assert_close(g, e)
    # the state is really zeroed at a reset: the step after it matches a fresh start
    fresh = memories[0].step(obs[2, 1:2], torch.zeros(1, memories[0].state_size, dtype=torch.float64))[1]
    stacked = stacked.detach()
    torch.testing.assert_close(stacked[2, 0, 1:2], fresh)


def test_unroll_refuses_memories_of_different_kinds():
    with pytest.raises(ValueError, match="kind and size"):
        unroll(
            [RecurrentEncoder(3, (), "tanh", "gru", 4), RecurrentEncoder(3, (), "tanh", "lstm", 4)],
            torch.zeros(2, 1, 3),
            torch.zeros(2, 1, 8),
            torch.zeros(2, 1, dtype=torch.bool),
        )


def test_the_mlp_forward_sees_every_change_of_its_parameters():
    """The forward's plan holds the layers' parameter dicts, not the parameters: a copy, a
    loaded state, a parameter replaced in the dict and ``functional_call`` all compute with the
    parameters they should."""
    import copy

    from torch.func import functional_call

    from agents.nets.mlp import mlp

    torch.manual_seed(0)
    net = mlp(3, (8,), 2, "tanh")
    x = torch.randn(5, 3)
    reference = torch.nn.Sequential(*net)  # torch's own forward over the same layers
    torch.testing.assert_close(net(x), reference(x), rtol=0, atol=0)
    twin = copy.deepcopy(net)
    with torch.no_grad():
        twin[0].weight.add_(1.0)
    assert not torch.equal(twin(x), net(x)) and torch.equal(net(x), reference(x))
    net.load_state_dict(twin.state_dict())
    assert torch.equal(net(x), twin(x))
    zeros = {name: torch.zeros_like(value) for name, value in net.named_parameters()}
    assert torch.equal(functional_call(net, zeros, (x,)), torch.zeros(5, 2))
    assert torch.equal(net(x), twin(x))  # the parameters are back after the call
    net[2].weight = torch.nn.Parameter(torch.ones(2, 8))
    torch.testing.assert_close(net(x), torch.tanh(net[0](x)) @ torch.ones(8, 2) + net[2].bias)
    net[1] = torch.nn.ReLU()  # a layer replaced: the plan follows
    torch.testing.assert_close(net(x), torch.relu(net[0](x)) @ torch.ones(8, 2) + net[2].bias)
