# nvinject's release images. Included by the root Makefile; run from the
# repository root.
#
# make images writes each daemon's image as an OCI archive under
# _out/images/ with the builder the local node uses (deploy/ociimage, no Docker
# daemon, no registry): the program from bin/ on a glibc base made of the
# Debian packages libc6 and libgcc-s1 (go-nvml dlopens the driver's
# libraries, so the daemons need glibc), a non-root default user, OCI labels
# with the version and VCS revision, and the image's file list beside it.
# The local node (make e2e, make demo) imports exactly these archives.
# deploy/README.md shows how to push them (skopeo copy oci-archive:…).
IMAGE_REGISTRY ?= ghcr.io/nvinject
IMAGE_TAG      ?= v$(VERSION)
IMAGES_DIR     := $(CURDIR)/_out/images
IMAGE_BASE_PACKAGES := libc6 libgcc-s1
# name:program[,more programs] of each release image (the device plugin's
# init container installs nvinject-cdi-hook on the node).
NVINJECT_IMAGES := device-plugin:nvinject-device-plugin,nvinject-cdi-hook nri:nvinject-nri dra:nvinject-dra,nvinject-cdi-hook
export IMAGE_REGISTRY IMAGE_TAG

.PHONY: images
images: build ## the release images as OCI archives in _out/images (no Docker)
	@mkdir -p $(IMAGES_DIR)
	@printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > $(IMAGES_DIR)/passwd
	@printf 'root:x:0:\nnonroot:x:65532:\n' > $(IMAGES_DIR)/group
	@for spec in $(NVINJECT_IMAGES); do name=$${spec%%:*}; progs=$${spec#*:}; prog=$${progs%%,*}; \
	  ref=$(IMAGE_REGISTRY)/nvinject-$$name:$(IMAGE_TAG); \
	  files=""; for p in $${progs//,/ }; do files="$$files --file $(BIN)/$$p=/usr/bin/$$p"; done; \
	  base=$$(dpkg-query -W -f='$${Package}=$${Version} ' $(IMAGE_BASE_PACKAGES)); \
	  $(BIN)/nvinject-image --ref $$ref -o $(IMAGES_DIR)/nvinject-$$name.oci.tar --list $(IMAGES_DIR)/nvinject-$$name.files.txt \
	    $(addprefix --dpkg ,$(IMAGE_BASE_PACKAGES)) $$files \
	    --file $(IMAGES_DIR)/passwd=/etc/passwd --file $(IMAGES_DIR)/group=/etc/group \
	    --entrypoint /usr/bin/$$prog --user 65532:65532 \
	    --label org.opencontainers.image.title=nvinject-$$name \
	    --label org.opencontainers.image.version=$(VERSION) \
	    --label org.opencontainers.image.revision=$(REVISION) \
	    --label org.opencontainers.image.source=https://github.com/nvinject/nvinject \
	    --label org.opencontainers.image.licenses=Apache-2.0 \
	    --label "io.nvinject.base-packages=$${base% }" || exit 1; \
	  echo "images: $$ref -> $(IMAGES_DIR)/nvinject-$$name.oci.tar ($$(du -h $(IMAGES_DIR)/nvinject-$$name.oci.tar | cut -f1))"; done

# With Docker: one parameterised Dockerfile, the same program and version.
.PHONY: docker-images
docker-images: ## the release images with docker build (deploy/images/Dockerfile)
	@for spec in $(NVINJECT_IMAGES); do name=$${spec%%:*}; prog=$${spec#*:}; prog=$${prog%%,*}; \
	  docker build -f deploy/images/Dockerfile --build-arg PROGRAM=$$prog --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
	    -t $(IMAGE_REGISTRY)/nvinject-$$name:$(IMAGE_TAG) . || exit 1; done
