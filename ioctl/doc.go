// Package ioctl is the kernel's uverbs ABI and nothing else: the uapi structs
// and constants generated from the kernel headers, the RDMA_VERBS_IOCTL
// attribute builder, legacy write() and INVOKE_WRITE commands, and the mapping
// of errno values to Go errors.
//
// It holds no policy and allocates nothing on the data path. Users of goverbs
// normally import uverbs, qp and cq instead; ioctl is for those who write a
// provider or need a command the higher layers do not wrap.
//
// ztypes_linux.go is generated from the uapi headers of one Debian
// linux-libc-dev, pinned with their sha256 in internal/mkztypes/uapi.lock:
// `scripts/abi --update` (go generate runs it) fetches that package and
// regenerates; `scripts/abi`, a stage of scripts/test, checks that the
// committed file is what those headers generate.
package ioctl

//go:generate ../scripts/abi --update
