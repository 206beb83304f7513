# Included by the root Makefile (after e2e/harness/tools/tools.mk). `make bench-injection`
# (root) starts its own containerd + runc + nvinject-nri under /tmp/nvinject-injbench,
# creates INJBENCH_N GPU containers through containerd's own CDI and INJBENCH_N
# through nvinject-nri, interleaved, prints medians, p90s and the ratio b/a as a
# table and a JSON line, and tears everything down.
INJBENCH_N ?= 200

.PHONY: bench-injection
bench-injection: build tools ## GPU container create+start: nvinject vs containerd native CDI (root)
	$(EQUIPMENT)/injbench -n $(INJBENCH_N) -bin $(EQUIPMENT) -tools-bin $(NVINJECT_TOOLS_BIN)
