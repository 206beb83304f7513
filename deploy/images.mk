# nvinject's release images. Included by the root Makefile; run from the
# repository root.
#
# make images writes each daemon's image as an OCI archive under
# _out/images/ with the builder the local node uses (deploy/ociimage, no Docker
# daemon, no registry): the program from bin/ on a glibc base made of the
# Debian packages libc6 and libgcc-s1 (go-nvml dlopens the driver's
# libraries, so the daemons need glibc), a non-root default user, OCI labels
# with the version and VCS revision, and the image's file list beside it.
# The local node (make e2e, make demo) imports the same images built from the
# programs' SIMULATION builds (make sim-images): same base, files and labels.
# deploy/README.md shows how to push them (skopeo copy oci-archive:…).
IMAGE_REGISTRY ?= ghcr.io/nvinject
IMAGE_TAG      ?= v$(VERSION)
IMAGES_DIR     := $(CURDIR)/_out/images
IMAGE_BASE_PACKAGES := libc6 libgcc-s1
# name:program[,more programs] of each release image (the device plugin's
# init container installs nvinject-cdi-hook on the node).
NVINJECT_IMAGES := device-plugin:nvinject-device-plugin,nvinject-cdi-hook nri:nvinject-nri dra:nvinject-dra,nvinject-cdi-hook
export IMAGE_REGISTRY IMAGE_TAG

# build-images writes the images of the programs in $(1) into $(2).
define build-images
	@mkdir -p $(2)
	@printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > $(2)/passwd
	@printf 'root:x:0:\nnonroot:x:65532:\n' > $(2)/group
	@for spec in $(NVINJECT_IMAGES); do name=$${spec%%:*}; progs=$${spec#*:}; prog=$${progs%%,*}; \
	  ref=$(IMAGE_REGISTRY)/nvinject-$$name:$(IMAGE_TAG); \
	  files=""; for p in $${progs//,/ }; do files="$$files --file $(1)/$$p=/usr/bin/$$p"; done; \
	  base=$$(dpkg-query -W -f='$${Package}=$${Version} ' $(IMAGE_BASE_PACKAGES)); \
	  $(BIN)/nvinject-image --ref $$ref -o $(2)/nvinject-$$name.oci.tar --list $(2)/nvinject-$$name.files.txt \
	    $(addprefix --dpkg ,$(IMAGE_BASE_PACKAGES)) $$files \
	    --file $(2)/passwd=/etc/passwd --file $(2)/group=/etc/group \
	    --entrypoint /usr/bin/$$prog --user 65532:65532 \
	    --label org.opencontainers.image.title=nvinject-$$name \
	    --label org.opencontainers.image.version=$(VERSION) \
	    --label org.opencontainers.image.revision=$(REVISION) \
	    --label org.opencontainers.image.source=https://github.com/nvinject/nvinject \
	    --label org.opencontainers.image.licenses=Apache-2.0 \
	    --label "io.nvinject.base-packages=$${base% }" || exit 1; \
	  echo "images: $$ref -> $(2)/nvinject-$$name.oci.tar ($$(du -h $(2)/nvinject-$$name.oci.tar | cut -f1))"; done
endef

.PHONY: images
images: build ## the release images as OCI archives in _out/images (no Docker)
	$(call build-images,$(BIN),$(IMAGES_DIR))

# The local node (make e2e, make demo, make test) runs the same images with
# the SIMULATION build of each program, so --nvml=sim:... works in them.
SIM_IMAGES_DIR := $(EQUIPMENT)/images
.PHONY: sim-images
sim-images: build ## the daemons' images with their SIMULATION builds, for the local node, in _out/equipment/images
	$(call build-images,$(EQUIPMENT),$(SIM_IMAGES_DIR))

# With Docker: one parameterised Dockerfile, the same program and version.
.PHONY: docker-images
docker-images: ## the release images with docker build (deploy/images/Dockerfile)
	@for spec in $(NVINJECT_IMAGES); do name=$${spec%%:*}; prog=$${spec#*:}; prog=$${prog%%,*}; \
	  docker build -f deploy/images/Dockerfile --build-arg PROGRAM=$$prog --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
	    -t $(IMAGE_REGISTRY)/nvinject-$$name:$(IMAGE_TAG) . || exit 1; done
