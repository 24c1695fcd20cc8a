"""resnet18 and neuroflow_cnn: structure, names, parameter counts, PyTorch parity, registry entries."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import registry
from neuroflow.testing import gradcheck
from neuroflow_ops_vision import BasicBlock, ResNet, neuroflow_cnn, resnet18
from neuroflow_ops_vision.models.torch_twin import torch_resnet18

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_resnet18_matches_torchvision_cifar_size() -> None:
    model = resnet18(num_classes=10)
    assert sum(p.data.size for p in model.parameters()) == 11_173_962
    names = [name for name, _ in model.named_parameters()]
    assert names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert names[-2:] == ["fc.weight", "fc.bias"]
    assert "layer2.0.downsample.0.weight" in names and "layer2.0.downsample.1.bias" in names
    assert "layer1.0.downsample.0.weight" not in names
    buffers = dict(model.named_buffers())
    assert buffers["layer4.1.bn2.running_var"].shape == (512,)
    assert model.conv1.weight.shape == (64, 3, 3, 3)


def test_resnet18_imagenet_stem_and_other_classes() -> None:
    model = resnet18(num_classes=100, small_input=False)
    assert model.conv1.weight.shape == (64, 3, 7, 7)
    assert model.output_shape((2, 3, 64, 64)) == (2, 100)
    assert sum(p.data.size for p in model.parameters()) == 11_689_512 - 513_000 + 51_300  # torchvision, 100 classes


def test_resnet18_forward_backward_shapes(rng: np.random.Generator) -> None:
    model = resnet18(num_classes=10)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    y = model.forward(x)
    assert y.shape == (2, 10) == model.output_shape(x.shape)
    gx = model.backward(np.ones_like(y))
    assert gx.shape == x.shape
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


def test_resnet18_last_stage_backward_runs_in_one_chunk_at_batch_32() -> None:
    """The last stage's 9 MiB kernels are flipped once per backward chunk: its convolutions' columns for a
    CIFAR batch of 32 fit one chunk; the first stage's, 8× larger per sample, are still chunked."""
    model = resnet18(num_classes=10)
    last, first = model.layer4[1].conv2, model.layer1[0].conv1
    assert last.grad_chunk_size((32, 4, 4, 512)) == 32
    assert last.chunk_size((32, 4, 4, 512)) == 32
    assert first.grad_chunk_size((32, 32, 32, 64)) < 32


@pytest.mark.parametrize("stride, cin, cout", [(1, 4, 4), (2, 4, 6)])
def test_basic_block_gradcheck(stride: int, cin: int, cout: int, rng: np.random.Generator) -> None:
    gradcheck(BasicBlock(cin, cout, stride), rng.standard_normal((2, 5, 5, cin)))


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_resnet18_matches_pytorch_by_parameter_name(rng: np.random.Generator) -> None:
    """Weights copied by name give the same outputs (train and eval) and, in float64, the same gradients."""
    import torch

    model = resnet18(num_classes=10)
    reference = torch_resnet18(10)
    missing, unexpected = reference.load_state_dict(
        {k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()}, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    assert [n for n, _ in reference.named_parameters()] == [n for n, _ in model.named_parameters()]
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    for training in (True, False):
        model.train(training)
        reference.train(training)
        np.testing.assert_allclose(model.forward(x), reference(torch.from_numpy(x)).detach().numpy(), rtol=1e-3, atol=1e-4)
    model.train().astype(np.float64)
    reference.train().double()
    y = rng.integers(0, 10, 4)
    loss = nf.losses.CrossEntropy()
    loss.forward(model.forward(x.astype(np.float64)), y)
    model.backward(loss.backward())
    torch.nn.functional.cross_entropy(reference(torch.from_numpy(x.astype(np.float64))), torch.from_numpy(y)).backward()
    grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, grads[name].grad.numpy(), rtol=1e-7, atol=1e-10, err_msg=name)


def test_neuroflow_cnn(rng: np.random.Generator) -> None:
    model = neuroflow_cnn(num_classes=10)
    assert 50_000 < sum(p.data.size for p in model.parameters()) < 70_000
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"SeparableConv2d", "SqueezeExcite", "Residual", "BatchNorm2d"} <= kinds
    x = rng.random((3, 1, 28, 28)).astype(np.float32)
    assert model.forward(x).shape == (3, 10) == model.output_shape(x.shape)
    assert model.backward(np.ones((3, 10), np.float32)).shape == x.shape


def test_neuroflow_cnn_gradcheck(rng: np.random.Generator) -> None:
    model = neuroflow_cnn(num_classes=3, width=4)
    gradcheck(model, rng.random((2, 1, 8, 8)), max_checks=8, atol=1e-4, rtol=1e-3)


def test_builders_are_registered_models() -> None:
    assert registry.models.get("resnet18") is resnet18
    assert registry.models.get("neuroflow_cnn") is neuroflow_cnn
    assert registry.models.distribution("resnet18") == "neuroflow-ops-vision"


def test_trainer_skips_the_first_layers_input_gradient(rng: np.random.Generator) -> None:
    model = neuroflow_cnn(num_classes=10, width=8)
    trainer = nf.Trainer(model, nf.losses.CrossEntropy(), nf.optim.SGD(lr=0.01), batch_size=4, progress=False, seed=0)
    losses = [trainer.train_step(rng.random((4, 1, 12, 12)).astype(np.float32), rng.integers(0, 10, 4)) for _ in range(2)]
    assert all(np.isfinite(losses))
    assert model[0].needs_input_grad is False


def test_resnet_get_config_rebuilds_it() -> None:
    model = resnet18(num_classes=7, small_input=False, input_layout="NHWC", recompute_block_outputs=False)
    rebuilt = ResNet(**model.get_config())
    assert rebuilt.recompute_block_outputs is False
    assert [(n, p.shape) for n, p in rebuilt.named_parameters()] == [(n, p.shape) for n, p in model.named_parameters()]
    assert rebuilt.output_shape((1, 32, 32, 3)) == (1, 7)


@pytest.mark.parametrize("small_input", [True, False])
def test_recomputed_block_outputs_give_the_same_gradients_bit_for_bit(small_input: bool, rng: np.random.Generator) -> None:
    """Backward rebuilds each block's input from the maps BatchNorm keeps; with the kept outputs overwritten
    after forward (as a planned step reuses their memory), the gradients must still be exactly those of a
    model that kept them. The ImageNet stem's max-pool output is kept, the CIFAR stem's BatchNorm output not."""
    x = rng.standard_normal((4, 3, 32, 32))
    grads = {}
    for recompute in (False, True):
        nf.manual_seed(3)
        model = resnet18(num_classes=5, small_input=small_input, recompute_block_outputs=recompute, dtype=np.float64)
        y = model.forward(x)
        if recompute:  # what a planned step's later buffers would do to memory the plan reuses
            blocks = [b for stage in (model.layer1, model.layer2, model.layer3, model.layer4) for b in stage]
            for block in blocks[:-1]:  # the last block's output is kept
                block._out[...] = np.nan
            if small_input:
                model.bn1._y[...] = np.nan
        model.backward(np.cos(np.arange(y.size).reshape(y.shape)))
        grads[recompute] = {name: p.grad.copy() for name, p in model.named_parameters()}
    for name, grad in grads[False].items():
        np.testing.assert_array_equal(grads[True][name], grad, err_msg=name)


def test_recompute_output_is_the_forward_output_bit_for_bit(rng: np.random.Generator) -> None:
    for block in (BasicBlock(4, 4), BasicBlock(4, 6, stride=2)):
        x = rng.standard_normal((2, 6, 6, 4)).astype(np.float32)
        out = block.forward(x)
        expected = out.copy()
        out[...] = np.nan  # the memory a planned step would reuse
        np.testing.assert_array_equal(block.recompute_output(x), expected)


def test_recompute_output_errors() -> None:
    block = BasicBlock(4, 4)
    with pytest.raises(RuntimeError, match="before forward"):
        block.recompute_output(None)
    block.forward(np.ones((2, 5, 5, 4), np.float32))
    with pytest.raises(ValueError, match="identity shortcut needs the block's input"):
        block.recompute_output(None)


def test_a_block_may_overwrite_its_output_gradient(rng: np.random.Generator) -> None:
    block = BasicBlock(4, 6, stride=2)
    x = rng.standard_normal((2, 6, 6, 4)).astype(np.float32)
    grad = rng.standard_normal(block.forward(x).shape).astype(np.float32)
    expected = block.backward(grad.copy())
    scratch = grad.copy()
    np.testing.assert_array_equal(block.backward(scratch, overwrite_grad_out=True), expected)
    np.testing.assert_array_equal(scratch, grad * (block._out > 0))  # the ReLU's masked gradient went there
