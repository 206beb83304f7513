// Package hostile runs the CDI spec's createContainer hooks against
// hostile images, for real: each crafted root is a container that runc
// (the pinned one, and one from before 1.3) creates with the hooks
// nvinject's spec generator writes, so each hook runs as runc runs it, as
// root in the container's new mount and PID namespaces, its procfs at
// ROOT/proc, cwd the root, the OCI state on stdin. nvinject-cdi-hook and
// NVIDIA's nvidia-cdi-hook run side by side on every case, with the host's
// static ldconfig and with an Ubuntu-style /bin/sh wrapper of it. A case
// passes only when nothing outside the container root changed: every
// attack aims at a host directory of the test, whose files, links, modes,
// times and listings are compared before and after. The table of results
// is logged (-v). docs/security.md lists what each case stands for.
package hostile
