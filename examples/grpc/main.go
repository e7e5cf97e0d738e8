// Grpc shows gRPC over ByteExpress (package bx/bxgrpc) with a generated
// service that ships with gRPC: the health service
// (google.golang.org/grpc/health). The server registers it on a
// grpc.Server and serves that on a bx endpoint (bxgrpc.Serve); the client
// is an ordinary grpc.ClientConn whose connections are bx Conns
// (bxgrpc.NewClient), so gRPC's HTTP/2 frames travel over RC queue pairs.
//
// The server reports its service NOT_SERVING while it warms up, then
// SERVING (SetServingStatus), and NOT_SERVING again when it shuts down.
// The client watches the status until it is SERVING, checks it, and checks
// a service the server does not know (NotFound).
//
// In the rxe guest (docs/vm.md), both roles in one process (the server on
// rxe1 at 10.99.0.2, the client on rxe0):
//
//	scripts/vm -- go run ./examples/grpc
//
// As two processes (the server runs until interrupted):
//
//	scripts/vm -- sh -c 'go build -o /tmp/grpc ./examples/grpc &&
//		{ /tmp/grpc -role server & sleep 2; /tmp/grpc -role client; kill $!; wait; }'
//
// Between two machines: `grpc -role server -d DEV -addr IP:7000` on one,
// `grpc -role client -d DEV -addr IP:7000` on the other.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/bx/bxgrpc"
	"github.com/goverbs/goverbs/examples/internal/exrun"
)

// token authenticates the peers: both ends must hold the same one, at least
// 16 bytes. A real deployment reads it from a secret, not from its source.
var token = []byte("goverbs-examples-token")

// service is the name the server reports the health of.
const service = "example.Backend"

// warmUp stands for what a real server does before it serves (loading
// data, say); health checkers see NOT_SERVING meanwhile.
const warmUp = 500 * time.Millisecond

// example is this program; exrun gives it its flags (-role, -d, -addr)
// and runs both roles in one process.
var example = exrun.BX("grpc", server, client)

func main() { example.Main() }

// server serves until ctx ends.
func server(ctx context.Context, dev, addr string, out io.Writer, ready chan<- string) (err error) {
	e, err := bx.New(bx.Config{Device: dev, Token: token})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	a, err := e.Listen(addr)
	if err != nil {
		return err
	}

	s := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus(service, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(s, hs)
	served := make(chan error, 1)
	go func() { served <- bxgrpc.Serve(s, e) }()
	fmt.Fprintf(out, "server: listening on %s (%s)\n", a, dev)
	if ready != nil {
		ready <- a.String()
	}

	select {
	case <-time.After(warmUp):
		hs.SetServingStatus(service, healthpb.HealthCheckResponse_SERVING)
		fmt.Fprintf(out, "server: %s is SERVING\n", service)
	case <-ctx.Done():
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
	// Tell watchers (load balancers) to go elsewhere, then finish the
	// RPCs in flight.
	hs.Shutdown()
	s.GracefulStop()
	if err := <-served; err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintln(out, "server: stopped")
	return nil
}

func client(ctx context.Context, dev, addr string, out io.Writer) (err error) {
	e, err := bx.New(bx.Config{Device: dev, Token: token})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	cc, err := bxgrpc.NewClient(e, addr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cc.Close()) }()
	hc := healthpb.NewHealthClient(cc)

	// Watch sends the current status, then every change.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("watch %s: %w", service, err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			return fmt.Errorf("watch %s: %w", service, err)
		}
		fmt.Fprintf(out, "client: watch %s: %v\n", service, r.GetStatus())
		if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	stopWatch()

	r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("check %s: %w", service, err)
	}
	fmt.Fprintf(out, "client: check %s: %v\n", service, r.GetStatus())
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("check %s: %v after the watch saw SERVING", service, r.GetStatus())
	}

	// A service the server does not know is an error: NotFound.
	const unknown = "example.Unknown"
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: unknown})
	if status.Code(err) != codes.NotFound {
		return fmt.Errorf("check %s: error %v, want NotFound", unknown, err)
	}
	fmt.Fprintf(out, "client: check %s: %v\n", unknown, status.Code(err))
	return nil
}
