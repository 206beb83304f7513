# Included by the root Makefile. Equipment for tests and demos with NVIDIA's REAL driver
# user space and no kernel module; each target prints its result's path on its last line
# (`make -s driver-root | tail -1`), progress goes to stderr.
NVINJECT_DRIVERROOT_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
NVINJECT_E2E_DIR := $(patsubst %/,%,$(dir $(NVINJECT_DRIVERROOT_DIR)))
DRIVER_LAYOUT ?= flat
DRIVER_VERSION ?= 535.261.03

# make driver-root [DRIVER_LAYOUT=flat|debian] [DRIVER_VERSION=535.261.03|550.163.01]:
# NVIDIA's driver user space from Debian's archive (535 from bookworm, 550 from trixie;
# private apt state, nothing installed), cached machine-wide.
.PHONY: driver-root
driver-root: ## NVIDIA's real driver user space from Debian's archive, cached (DRIVER_LAYOUT, DRIVER_VERSION)
	@DRIVER_LAYOUT=$(DRIVER_LAYOUT) DRIVER_VERSION=$(DRIVER_VERSION) $(NVINJECT_DRIVERROOT_DIR)/build.sh

# make nvidia-ctk: NVIDIA's nvidia-ctk and nvidia-cdi-hook (v1.20.2), prints the bin dir.
.PHONY: nvidia-ctk
nvidia-ctk: ## NVIDIA's nvidia-ctk and nvidia-cdi-hook (v1.20.2) built and cached; prints the bin dir
	@$(NVINJECT_E2E_DIR)/nvctk/build.sh

# make bookworm-rootfs: a minimal Debian bookworm rootfs tar (mmdebstrap; needs root), the
# glibc base for workload images and chroots; prints the tar's path.
.PHONY: bookworm-rootfs
bookworm-rootfs: ## a minimal Debian bookworm rootfs tar for workload images (root)
	@$(NVINJECT_E2E_DIR)/bookworm/build.sh
