// Package bxgrpc runs gRPC over ByteExpress: the client dials bx Conns
// (bx.Endpoint.DialConn) instead of TCP connections, the server accepts
// them from the endpoint's Listener. gRPC itself is unchanged: its HTTP/2
// frames travel as bx messages over RC QPs, with bx's credits, send window
// and recovery underneath.
//
// Client:
//
//	e, _ := bx.New(bx.Config{Device: "rxe0", Token: token})
//	cc, _ := bxgrpc.NewClient(e, "10.99.0.2:7000")
//	client := pb.NewGreeterClient(cc)
//
// Server:
//
//	e, _ := bx.New(bx.Config{Device: "rxe1", Token: token})
//	e.Listen("10.99.0.2:7000")
//	s := grpc.NewServer()
//	pb.RegisterGreeterServer(s, impl)
//	bxgrpc.Serve(s, e)
//
// Security: bx authenticates peers with its token (and, with Config.TLS,
// runs its control connection over TLS), so the helpers use gRPC's insecure
// transport credentials by default; the RDMA data plane itself is not
// encrypted. Pass grpc.WithTransportCredentials to NewClient (and
// grpc.Creds to the server) to run TLS inside the Conns as well.
package bxgrpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/goverbs/goverbs/bx"
)

// Dialer returns a gRPC context dialer (grpc.WithContextDialer) that opens
// a bx Conn from e to addr, a bx Listen address ("host:port"). Conns to
// one address share one bx peer (its QPs), as bx.Endpoint.DialConn does.
func Dialer(e *bx.Endpoint) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		if e == nil {
			return nil, errors.New("bxgrpc: dial with a nil Endpoint")
		}
		return e.DialConn(ctx, addr)
	}
}

// DialOptions are the options a gRPC client over e needs: the bx dialer
// and insecure transport credentials (see the package doc). Options passed
// after them to grpc.NewClient override them.
func DialOptions(e *bx.Endpoint) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithContextDialer(Dialer(e)),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}
}

// NewClient is grpc.NewClient for a server listening on a bx endpoint at
// addr ("host:port", its bx Listen address): the address goes to the bx
// dialer as it is (gRPC's passthrough resolver), with DialOptions(e) and
// then opts.
func NewClient(e *bx.Endpoint, addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if e == nil {
		return nil, errors.New("bxgrpc: NewClient with a nil Endpoint")
	}
	if addr == "" {
		return nil, errors.New("bxgrpc: NewClient: empty address")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil && !strings.Contains(addr, ":///") {
		return nil, fmt.Errorf("bxgrpc: NewClient: address %q: %w", addr, err)
	}
	target := addr
	if !strings.Contains(addr, ":///") {
		target = "passthrough:///" + addr
	}
	return grpc.NewClient(target, append(DialOptions(e), opts...)...)
}

// Serve serves s on e's Listener (bx.Endpoint.Listener): every Conn a
// client opens to e becomes one gRPC transport. Call e.Listen first so
// clients can reach the endpoint. It returns when s stops (nil after
// s.Stop or s.GracefulStop) or e closes.
func Serve(s *grpc.Server, e *bx.Endpoint) error {
	if s == nil {
		return errors.New("bxgrpc: Serve with a nil grpc.Server")
	}
	if e == nil {
		return errors.New("bxgrpc: Serve with a nil Endpoint")
	}
	if len(e.ListenAddrs()) == 0 {
		return errors.New("bxgrpc: Serve: the endpoint listens nowhere (call Endpoint.Listen first)")
	}
	return s.Serve(e.Listener())
}
