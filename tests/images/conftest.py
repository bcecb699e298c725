"""Fixtures of the image smoke tests: both images built once per session (docker/build.sh,
cached by content) and loaded into one private buildah store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from image_harness import BuiltImages, Store, build_images


@pytest.fixture(scope="session")
def built_images(tmp_path_factory: pytest.TempPathFactory) -> BuiltImages:
    return build_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="session")
def image_store(built_images: BuiltImages) -> Iterator[Store]:
    store = Store(built_images.env["MOE_IMAGES_STORAGE_DRIVER"])
    try:
        yield store
    finally:
        store.remove()


@pytest.fixture(scope="session")
def operator_image(built_images: BuiltImages, image_store: Store) -> str:
    """The operator image's id in the store, loaded from its OCI archive."""
    return image_store.load(built_images.archive("operator"))


@pytest.fixture(scope="session")
def runtime_image(built_images: BuiltImages, image_store: Store) -> str:
    """The runtime image's id in the store, loaded from its OCI archive."""
    return image_store.load(built_images.archive("runtime"))
