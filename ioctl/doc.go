// Package ioctl is the kernel's uverbs ABI and nothing else: the uapi structs
// and constants generated from the kernel headers, the RDMA_VERBS_IOCTL
// attribute builder, legacy write() and INVOKE_WRITE commands, and the mapping
// of errno values to Go errors.
//
// It holds no policy and allocates nothing on the data path. Users of goverbs
// normally import uverbs, qp and cq instead; ioctl is for those who write a
// provider or need a command the higher layers do not wrap.
package ioctl

//go:generate go run ./internal/mkztypes -o ztypes_linux.go
