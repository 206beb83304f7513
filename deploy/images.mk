# nvinject images. Included by the root Makefile (include deploy/images.mk);
# run from the repository root. Uses docker, podman or buildah, the first
# that answers (a docker CLI without a daemon does not count); the local
# harness (e2e/) builds OCI archives itself.
IMAGE_REGISTRY ?= ghcr.io/nvinject
IMAGE_TAG      ?= v0.1.0
IMAGE_BUILDER  ?= $(shell for b in "docker info" "podman info" "buildah version"; do \
                    $$b >/dev/null 2>&1 && { echo $${b%% *}; break; }; done)

NVINJECT_IMAGES := device-plugin nri dra

.PHONY: images $(addprefix image-,$(NVINJECT_IMAGES))
images: $(addprefix image-,$(NVINJECT_IMAGES))

$(addprefix image-,$(NVINJECT_IMAGES)): image-%:
ifeq ($(IMAGE_BUILDER),)
	@echo "images: no working image builder (docker daemon, podman or buildah) on this machine; skipped $(IMAGE_REGISTRY)/nvinject-$*:$(IMAGE_TAG)." >&2
	@echo "images: the local harness builds OCI archives itself; install one of them to build these images." >&2
else ifeq ($(IMAGE_BUILDER),buildah)
	buildah bud -f deploy/images/$*.Dockerfile -t $(IMAGE_REGISTRY)/nvinject-$*:$(IMAGE_TAG) .
else
	$(IMAGE_BUILDER) build -f deploy/images/$*.Dockerfile -t $(IMAGE_REGISTRY)/nvinject-$*:$(IMAGE_TAG) .
endif
