"""The training sets: CIFAR-10 read from its own Python format (downloaded when missing) and the synthetic set."""

import os

from runinfo import UserError

SYNTHETIC_SIZE = 50_000
SYNTHETIC_SEED = 0  # the synthetic images are the same in every run, whatever --seed says


class ImageSet:
    """uint8 HWC images and labels through the PIL transform chain, as torchvision's CIFAR10 feeds them."""

    def __init__(self, data, targets, transform):
        self.data, self.targets, self.transform = data, targets, transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        from PIL import Image
        return self.transform(Image.fromarray(self.data[index])), self.targets[index]


class SyntheticCIFAR10(ImageSet):
    """CIFAR-shaped uint8 images and labels from a fixed seed."""

    def __init__(self, transform, size=SYNTHETIC_SIZE, seed=SYNTHETIC_SEED):
        import numpy as np
        rng = np.random.default_rng(seed)
        super().__init__(rng.integers(0, 256, size=(size, 32, 32, 3), dtype=np.uint8),
                         rng.integers(0, 10, size=size).tolist(), transform)


def read_cifar10(folder):
    """The training batches of CIFAR-10's Python format (cifar-10-batches-py), as (N, 32, 32, 3) uint8 and labels."""
    import pickle
    import numpy as np
    data, targets = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)]:
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="latin1")
            images = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            labels = [int(t) for t in batch["labels"]]
        except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError) as e:
            raise UserError(f"{folder} is not a readable CIFAR-10 folder ({name}: {type(e).__name__}: {e}); "
                            "remove it to download it again, or run with --data synthetic") from e
        if len(labels) != len(images) or not all(0 <= t < 10 for t in labels):
            raise UserError(f"{folder} is not a readable CIFAR-10 folder ({name}: {len(images)} images, "
                            f"{len(labels)} labels); remove it to download it again, or run with --data synthetic")
        data.append(images.transpose(0, 2, 3, 1))
        targets += labels
    return np.concatenate(data), targets


def download_cifar10(data_dir):
    """torchvision's download (archive checksum included); whatever it created is removed if it fails."""
    from torchvision.datasets import CIFAR10
    existed = os.path.isdir(data_dir)
    before = set(os.listdir(data_dir)) if existed else set()
    try:
        CIFAR10(root=data_dir, train=True, download=True)
    except (OSError, RuntimeError, ValueError) as e:  # URLError is an OSError
        import shutil
        for name in (set(os.listdir(data_dir)) - before if os.path.isdir(data_dir) else ()):
            path = os.path.join(data_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        if not existed and os.path.isdir(data_dir):
            shutil.rmtree(data_dir)
        raise UserError(
            f"CIFAR-10 is not in {data_dir} and could not be downloaded ({type(e).__name__}: {e}); "
            "give --data-dir a folder that holds cifar-10-batches-py, allow the download, "
            "or run with --data synthetic") from e
