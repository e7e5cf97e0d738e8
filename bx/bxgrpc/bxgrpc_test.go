package bxgrpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/bx/bxgrpc"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

var token = []byte("bxgrpc-test-token-0123456789")

// maxMsg lets 4 MiB payloads through (gRPC's default limit is 4 MiB in
// all, framing included).
const maxMsg = 8 << 20

// pattern is the payload of n bytes for seq: every byte depends on both,
// so a payload cut, shifted or taken from another message is caught.
func pattern(seq, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131 + seq*7 + i>>8)
	}
	return b
}

// service is the gRPC interop TestService: it echoes unary payloads and
// answers with pattern payloads of the sizes asked for; a unary request
// with ResponseSize -1 blocks until its context ends (deadlines,
// cancellation); with gate set, unary calls wait for it to close.
type service struct {
	testpb.UnimplementedTestServiceServer
	name    string
	gate    chan struct{}
	entered chan struct{} // a blocking or gated call started (buffered)
	ended   chan error    // a blocked call's context ended, with why
}

func newService(name string) *service {
	return &service{name: name, entered: make(chan struct{}, 64), ended: make(chan error, 64)}
}

func (s *service) UnaryCall(ctx context.Context, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if in.ResponseSize == -1 {
		s.entered <- struct{}{}
		<-ctx.Done()
		s.ended <- ctx.Err()
		return nil, ctx.Err()
	}
	if s.gate != nil {
		s.entered <- struct{}{}
		<-s.gate
	}
	body := in.GetPayload().GetBody()
	if in.ResponseSize > 0 {
		body = pattern(len(body), int(in.ResponseSize))
	}
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: body}, Username: s.name}, nil
}

func (s *service) StreamingOutputCall(in *testpb.StreamingOutputCallRequest, st grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	for i, p := range in.ResponseParameters {
		if err := st.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: pattern(i, int(p.Size))}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *service) StreamingInputCall(st grpc.ClientStreamingServer[testpb.StreamingInputCallRequest, testpb.StreamingInputCallResponse]) error {
	total := 0
	for i := 0; ; i++ {
		in, err := st.Recv()
		if err == io.EOF {
			return st.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: int32(total)})
		}
		if err != nil {
			return err
		}
		b := in.GetPayload().GetBody()
		if !bytes.Equal(b, pattern(i, len(b))) {
			return status.Errorf(codes.DataLoss, "request %d: %d bytes, not the pattern", i, len(b))
		}
		total += len(b)
	}
}

func (s *service) FullDuplexCall(st grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	for {
		in, err := st.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		// Echo the request's payload, then one pattern payload per
		// parameter.
		if err := st.Send(&testpb.StreamingOutputCallResponse{Payload: in.Payload}); err != nil {
			return err
		}
		for i, p := range in.ResponseParameters {
			if err := st.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: pattern(i, int(p.Size))}}); err != nil {
				return err
			}
		}
	}
}

// server is a bx endpoint serving the TestService.
type server struct {
	e    *bx.Endpoint
	s    *grpc.Server
	svc  *service
	addr string
	done chan error
}

func startServer(t *testing.T, dev, addr, name string) *server {
	t.Helper()
	e, err := bx.New(bx.Config{Device: dev, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	a, err := e.Listen(addr)
	if err != nil {
		e.Close()
		t.Fatal(err)
	}
	srv := &server{e: e, s: grpc.NewServer(grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg)), svc: newService(name), addr: a.String(), done: make(chan error, 1)}
	testpb.RegisterTestServiceServer(srv.s, srv.svc)
	go func() { srv.done <- bxgrpc.Serve(srv.s, e) }()
	t.Cleanup(srv.stop)
	return srv
}

// stop stops the gRPC server and closes the endpoint (again: a no-op).
func (s *server) stop() {
	s.s.Stop()
	s.e.Close()
}

// setup is a server on the second device and a client endpoint and
// connection on the first.
func setup(t *testing.T) (*server, testpb.TestServiceClient, *grpc.ClientConn) {
	t.Helper()
	da, db := rxetest.Pair(t)
	srv := startServer(t, db, listenAddr(db)+":0", "A")
	cc := client(t, da, srv.addr)
	return srv, testpb.NewTestServiceClient(cc), cc
}

func client(t *testing.T, dev, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	e, err := bx.New(bx.Config{Device: dev, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	opts = append([]grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg))}, opts...)
	cc, err := bxgrpc.NewClient(e, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// listenAddr is the IPv4 address of the guest's netdev under dev.
func listenAddr(dev string) string {
	if dev == "rxe1" {
		return "10.99.0.2"
	}
	return "10.99.0.1"
}

// TestUnary: unary calls of 0 B to 4 MiB each way, every payload
// verified; the sizes cross bx's eager limit and gRPC's frame and window
// sizes.
func TestUnary(t *testing.T) {
	_, tc, _ := setup(t)
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	for i, n := range []int{0, 1, 64, 4096, 8144, 8145, 16 << 10, 64 << 10, 1 << 20, 4 << 20} {
		req := pattern(i, n)
		resp, err := tc.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: req}})
		if err != nil {
			t.Fatalf("echo of %d bytes: %v", n, hang.Cause(ctx, err))
		}
		if got := resp.GetPayload().GetBody(); !bytes.Equal(got, req) {
			t.Fatalf("echo of %d bytes came back as %d bytes that differ", n, len(got))
		}
		// The other way: a small request asks for n bytes.
		resp, err = tc.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: int32(n), Payload: &testpb.Payload{Body: []byte{1, 2, 3}}})
		if err != nil {
			t.Fatalf("response of %d bytes: %v", n, hang.Cause(ctx, err))
		}
		if got, want := resp.GetPayload().GetBody(), pattern(3, n); n > 0 && !bytes.Equal(got, want) {
			t.Fatalf("response of %d bytes: got %d bytes that differ", n, len(got))
		}
		wd.Progress()
	}
	// Many concurrent calls share the one transport.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				req := pattern(g*1000+i, 100+g*977+i*13)
				resp, err := tc.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: req}})
				if err != nil {
					errs <- fmt.Errorf("caller %d call %d: %w", g, i, hang.Cause(ctx, err))
					return
				}
				if !bytes.Equal(resp.GetPayload().GetBody(), req) {
					errs <- fmt.Errorf("caller %d call %d: the echo differs", g, i)
					return
				}
				wd.Progress()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestStreaming: server, client and bidirectional streams with payloads
// verified in order.
func TestStreaming(t *testing.T) {
	_, tc, _ := setup(t)
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	sizes := []int{0, 7, 4096, 8145, 100_000, 1 << 20, 33}

	t.Run("server", func(t *testing.T) {
		var params []*testpb.ResponseParameters
		for _, n := range sizes {
			params = append(params, &testpb.ResponseParameters{Size: int32(n)})
		}
		st, err := tc.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{ResponseParameters: params})
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range sizes {
			m, err := st.Recv()
			if err != nil {
				t.Fatalf("response %d: %v", i, hang.Cause(ctx, err))
			}
			if got := m.GetPayload().GetBody(); !bytes.Equal(got, pattern(i, n)) && !(n == 0 && len(got) == 0) {
				t.Fatalf("response %d: %d bytes, want the %d-byte pattern", i, len(got), n)
			}
			wd.Progress()
		}
		if _, err := st.Recv(); err != io.EOF {
			t.Fatalf("after the last response: %v, want io.EOF", err)
		}
	})

	t.Run("client", func(t *testing.T) {
		st, err := tc.StreamingInputCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for i, n := range sizes {
			if err := st.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: pattern(i, n)}}); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			total += n
			wd.Progress()
		}
		resp, err := st.CloseAndRecv()
		if err != nil {
			t.Fatal(hang.Cause(ctx, err))
		}
		if int(resp.AggregatedPayloadSize) != total {
			t.Fatalf("server counted %d bytes, sent %d", resp.AggregatedPayloadSize, total)
		}
	})

	t.Run("bidi", func(t *testing.T) {
		st, err := tc.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 40 {
			req := pattern(1000+i, (i*4099)%70_000)
			n := (i * 977) % 20_000
			if err := st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: req}, ResponseParameters: []*testpb.ResponseParameters{{Size: int32(n)}}}); err != nil {
				t.Fatalf("ping %d: %v", i, err)
			}
			echo, err := st.Recv()
			if err != nil {
				t.Fatalf("pong %d: %v", i, hang.Cause(ctx, err))
			}
			if !bytes.Equal(echo.GetPayload().GetBody(), req) {
				t.Fatalf("pong %d: the echo differs (%d bytes, sent %d)", i, len(echo.GetPayload().GetBody()), len(req))
			}
			extra, err := st.Recv()
			if err != nil {
				t.Fatalf("pong %d, second response: %v", i, hang.Cause(ctx, err))
			}
			if got := extra.GetPayload().GetBody(); !bytes.Equal(got, pattern(0, n)) && !(n == 0 && len(got) == 0) {
				t.Fatalf("pong %d, second response: %d bytes, want the %d-byte pattern", i, len(got), n)
			}
			wd.Progress()
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != io.EOF {
			t.Fatalf("after CloseSend: %v, want io.EOF", err)
		}
	})
}

// TestDeadlineAndCancel: a call past its deadline fails with
// DeadlineExceeded and a cancelled stream with Canceled, and in both the
// server's handler sees its context end (the cancellation crossed bx).
func TestDeadlineAndCancel(t *testing.T) {
	srv, tc, _ := setup(t)
	bound := hang.Scale(30 * time.Second) // a hang bound, not a speed bound
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(bound):
			t.Fatalf("%s: not in %v", what, bound)
		}
	}
	ended := func(what string) {
		t.Helper()
		select {
		case why := <-srv.svc.ended:
			if why == nil {
				t.Errorf("%s: the handler's context ended without an error", what)
			}
		case <-time.After(bound):
			t.Fatalf("%s: the server's handler did not see it in %v", what, bound)
		}
	}
	// The connection first, so that the deadline below covers the call
	// only.
	warm, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if _, err := tc.UnaryCall(warm, &testpb.SimpleRequest{}); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(time.Second))
	defer cancel()
	_, err := tc.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: -1})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call past its deadline: %v, want DeadlineExceeded", err)
	}
	wait(srv.svc.entered, "the call with a deadline reaching its handler")
	ended("the deadline")

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := tc.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: -1})
		errc <- err
	}()
	wait(srv.svc.entered, "the call to cancel reaching its handler")
	cancel()
	select {
	case err := <-errc:
		if status.Code(err) != codes.Canceled {
			t.Fatalf("cancelled call: %v, want Canceled", err)
		}
	case <-time.After(bound):
		t.Fatalf("a cancelled call did not return in %v", bound)
	}
	ended("the cancellation")
}

// TestGracefulStop: GracefulStop lets the calls that run finish with their
// responses, refuses new ones, and returns once they are done.
func TestGracefulStop(t *testing.T) {
	srv, tc, _ := setup(t)
	bound := hang.Scale(60 * time.Second) // a hang bound, not a speed bound
	srv.svc.gate = make(chan struct{})
	const n = 8
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	type result struct {
		i   int
		err error
	}
	results := make(chan result, n)
	for i := range n {
		go func() {
			req := pattern(i, 1000+i)
			resp, err := tc.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: req}})
			if err == nil && !bytes.Equal(resp.GetPayload().GetBody(), req) {
				err = errors.New("the echo differs")
			}
			results <- result{i, err}
		}()
	}
	for range n {
		select {
		case <-srv.svc.entered:
		case <-time.After(bound):
			t.Fatalf("the calls did not all reach the server in %v", bound)
		}
	}
	stopped := make(chan struct{})
	go func() {
		srv.s.GracefulStop()
		close(stopped)
	}()
	// While the calls run, GracefulStop waits.
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned while calls were running")
	case <-time.After(100 * time.Millisecond):
	}
	close(srv.svc.gate)
	for range n {
		r := <-results
		if r.err != nil {
			t.Errorf("call %d, running when GracefulStop began: %v", r.i, r.err)
		}
	}
	select {
	case <-stopped:
	case <-time.After(bound):
		t.Fatalf("GracefulStop did not return in %v after the calls ended", bound)
	}
	if err := <-srv.done; err != nil {
		t.Errorf("Serve after GracefulStop: %v, want nil", err)
	}
	// The server is gone: a new call fails (fast, without WaitForReady).
	cctx, ccancel := context.WithTimeout(context.Background(), bound)
	defer ccancel()
	if _, err := tc.UnaryCall(cctx, &testpb.SimpleRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("a call after GracefulStop: %v, want Unavailable", err)
	}
}

// TestServerRestart: the server's endpoint goes away and a new one comes
// up on the same address; the client's connection reconnects (a new bx
// peer) and a call waiting for it succeeds, answered by the new server.
func TestServerRestart(t *testing.T) {
	da, db := rxetest.Pair(t)
	srv := startServer(t, db, listenAddr(db)+":0", "A")
	_, port, err := net.SplitHostPort(srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	cc := client(t, da, srv.addr, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: 5 * time.Second,
	}))
	tc := testpb.NewTestServiceClient(cc)
	bound := hang.Scale(90 * time.Second) // a hang bound, not a speed bound
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	call := func(i int) (string, error) {
		req := pattern(i, 512)
		resp, err := tc.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: req}}, grpc.WaitForReady(true))
		if err != nil {
			return "", err
		}
		if !bytes.Equal(resp.GetPayload().GetBody(), req) {
			return "", errors.New("the echo differs")
		}
		return resp.Username, nil
	}
	if who, err := call(1); err != nil || who != "A" {
		t.Fatalf("before the restart: %q, %v", who, err)
	}
	srv.stop()
	// Calls made while no server listens wait (WaitForReady) for the new
	// one. A call made before the client saw its connection go is sent on
	// it and fails (Unavailable), as over TCP: wait until it left READY.
	for st := cc.GetState(); st == connectivity.Ready; st = cc.GetState() {
		if !cc.WaitForStateChange(ctx, st) {
			t.Fatalf("the client's connection stayed READY after the server stopped: %v", ctx.Err())
		}
	}
	var answered atomic.Int32
	errc := make(chan error, 4)
	for i := range 4 {
		go func() {
			who, err := call(10 + i)
			if err == nil && who != "B" {
				err = fmt.Errorf("answered by %q, want the new server B", who)
			}
			if err == nil {
				answered.Add(1)
			}
			errc <- err
		}()
	}
	time.Sleep(200 * time.Millisecond)
	startServer(t, db, net.JoinHostPort(listenAddr(db), port), "B")
	for range 4 {
		if err := <-errc; err != nil {
			t.Errorf("a call across the restart: %v", err)
		}
	}
	if who, err := call(20); err != nil || who != "B" {
		t.Fatalf("after the restart: %q, %v", who, err)
	}
	t.Logf("%d calls waited across the restart and were answered by the new server", answered.Load())
}

// TestHelpersValidate: the helpers refuse what they cannot use, with an
// error that says what.
func TestHelpersValidate(t *testing.T) {
	if _, err := bxgrpc.NewClient(nil, "10.0.0.1:1"); err == nil {
		t.Error("NewClient with a nil endpoint succeeded")
	}
	if err := bxgrpc.Serve(nil, nil); err == nil {
		t.Error("Serve(nil, nil) succeeded")
	}
	if _, err := bxgrpc.Dialer(nil)(context.Background(), "10.0.0.1:1"); err == nil {
		t.Error("a nil endpoint's dialer dialed")
	}
	dev := rxetest.One(t)
	e, err := bx.New(bx.Config{Device: dev, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, addr := range []string{"", "no-port", "10.0.0.1"} {
		if _, err := bxgrpc.NewClient(e, addr); err == nil {
			t.Errorf("NewClient(%q) succeeded", addr)
		}
	}
	s := grpc.NewServer()
	if err := bxgrpc.Serve(s, e); err == nil {
		t.Error("Serve on an endpoint that listens nowhere succeeded")
	}
}
