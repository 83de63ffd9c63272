import pytest

pytest.importorskip("diffusers")


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These models are tiny: on a shared CPU more threads only wait on each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_unet():
    """A small class-conditioned UNet with seeded random weights (three resolutions, attention at the lowest)."""
    import torch
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16, 16),
                       down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D", "UpBlock2D"), norm_num_groups=4,
                       attention_head_dim=8, num_class_embeds=10).eval()


@pytest.fixture(scope="session")
def demo_model():
    """The shipped demo digits model (skips when its folder is absent)."""
    from tokenops.backends.registry import DEMO_DIFFUSION_NAME
    from pathlib import Path

    import tokenops
    from tokenops.diffusion.model import DiffusionModel

    folder = Path(tokenops.__file__).parent / "demo_models" / DEMO_DIFFUSION_NAME
    if not (folder / "model_index.json").is_file():
        pytest.skip("the demo diffusion model is not shipped in this checkout")
    return DiffusionModel.load(folder)
