//go:build goverbs_grpc

package main

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/bx/bxgrpc"
)

// goverbs perf grpc_lat, grpc_tcp_lat, grpc_bw, grpc_tcp_bw: the bx_lat
// family's calls as gRPC unary calls to an echo method, with gRPC over bx
// (package bxgrpc: its HTTP/2 over bx Conns) or over kernel TCP. Payloads
// are raw bytes (a pass-through codec), so what is measured is gRPC and
// the transport, not protobuf.
//
// This file is built only with -tags goverbs_grpc (scripts/bench-bx --grpc
// and scripts/test build it so): gRPC is about a hundred packages and
// several MB that the shipped goverbs does not need. Without the tag,
// grpc_* tests fail with errPerfNoGRPC (perf_bx.go).

func init() { perfGRPC = perfGRPCImpl{} }

// perfGRPCImpl is perf_bx.go's perfGRPCTests with gRPC linked in.
type perfGRPCImpl struct{}

func (perfGRPCImpl) caller(ep *bx.Endpoint, addr string, size int) (perfCaller, func() error, error) {
	c, err := newPerfGRPCCaller(ep, addr, perfGRPCMaxMsg(size))
	if err != nil {
		return nil, nil, err
	}
	return c, c.Close, nil
}

func (perfGRPCImpl) serve(ep *bx.Endpoint, laddr string, size int) (func(), error) {
	s := perfGRPCServer(perfGRPCMaxMsg(size))
	if err := perfGRPCServe(s, ep, laddr); err != nil {
		s.Stop()
		return nil, err
	}
	return s.Stop, nil
}

// perfGRPCMethod is the echo method's full name.
const perfGRPCMethod = "/goverbs.perf.Echo/Call"

// perfRawCodec passes []byte through: a message is a *[]byte.
type perfRawCodec struct{}

func (perfRawCodec) Name() string { return "goverbs-raw" }

func (perfRawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("perf codec: marshal %T, want *[]byte", v)
	}
	return *b, nil
}

func (perfRawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("perf codec: unmarshal into %T, want *[]byte", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

// perfGRPCMaxMsg is the gRPC message limit both sides set for calls of
// size bytes: gRPC's default 4 MiB, or room for the payload and framing.
func perfGRPCMaxMsg(size int) int { return max(4<<20, 2*size+4096) }

// perfGRPCServer is a gRPC server with the echo method.
func perfGRPCServer(maxMsg int) *grpc.Server {
	s := grpc.NewServer(grpc.ForceServerCodec(perfRawCodec{}), grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg))
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "goverbs.perf.Echo",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Call",
			Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				var b []byte
				if err := dec(&b); err != nil {
					return nil, err
				}
				return &b, nil
			},
		}},
	}, struct{}{})
	return s
}

// perfGRPCServe serves s: on ep's Listener (bx, after ep.Listen), or on a
// TCP listener at laddr. s.Stop closes the listener.
func perfGRPCServe(s *grpc.Server, ep *bx.Endpoint, laddr string) error {
	if ep != nil {
		if _, err := ep.Listen(laddr); err != nil {
			return err
		}
		go bxgrpc.Serve(s, ep)
		return nil
	}
	l, err := net.Listen("tcp", laddr)
	if err != nil {
		return err
	}
	go s.Serve(l)
	return nil
}

// perfGRPCCaller makes the calls of a client.
type perfGRPCCaller struct {
	cc   *grpc.ClientConn
	resp []byte
}

func newPerfGRPCCaller(ep *bx.Endpoint, addr string, maxMsg int) (*perfGRPCCaller, error) {
	opts := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodec(perfRawCodec{}),
		grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg))}
	var cc *grpc.ClientConn
	var err error
	if ep != nil {
		cc, err = bxgrpc.NewClient(ep, addr, opts...)
	} else {
		cc, err = grpc.NewClient("passthrough:///"+addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	}
	if err != nil {
		return nil, err
	}
	return &perfGRPCCaller{cc: cc}, nil
}

func (c *perfGRPCCaller) call(req []byte) ([]byte, func(), error) {
	if err := c.cc.Invoke(context.Background(), perfGRPCMethod, &req, &c.resp); err != nil {
		return nil, nil, err
	}
	return c.resp, func() {}, nil
}

// concurrent returns a caller for another goroutine (bw tests): its own
// response buffer on the shared connection.
func (c *perfGRPCCaller) concurrent() perfCaller { return &perfGRPCCaller{cc: c.cc} }

func (c *perfGRPCCaller) Close() error { return c.cc.Close() }
