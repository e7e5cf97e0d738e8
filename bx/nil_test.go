package bx_test

import (
	"context"
	"testing"

	"github.com/goverbs/goverbs/bx"
)

// TestNilArguments: public functions given a nil receiver, context or
// buffer return an error (or do nothing), never panic. No device needed.
func TestNilArguments(t *testing.T) {
	ctx := context.Background()
	var p *bx.Peer
	var e *bx.Endpoint
	var s *bx.Stream
	var m *bx.Msg
	var b *bx.Buffer
	var c *bx.Conn
	errs := map[string]error{}
	_, errs["Peer.Call"] = p.Call(ctx, 1, nil)
	_, errs["Peer.CallBuffer"] = p.CallBuffer(ctx, 1, b)
	errs["Peer.Close"] = p.Close()
	errs["nil Peer's Stream.Send"] = p.Stream(1).Send(ctx, nil)
	_, errs["nil Peer's Stream.Recv"] = p.Stream(1).Recv(ctx)
	errs["nil Peer's Stream.Close"] = p.Stream(1).Close()
	errs["Stream.Send"] = s.Send(ctx, nil)
	errs["Stream.SendBuffer"] = s.SendBuffer(ctx, b)
	_, errs["Stream.Recv"] = s.Recv(ctx)
	errs["Stream.Close"] = s.Close()
	errs["Conn.Close"] = c.Close()
	_, errs["Endpoint.Dial"] = e.Dial(ctx, "127.0.0.1:1")
	_, errs["Endpoint.DialConn"] = e.DialConn(ctx, "127.0.0.1:1")
	_, errs["nil Endpoint's Listener.Accept"] = e.Listener().Accept()
	for name, err := range errs {
		if err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	m.Release()
	if m.Data() != nil || b.Payload() != nil || s.ID() != 0 || s.Peer() != nil {
		t.Error("nil Msg, Buffer or Stream gave data")
	}
	b.Free()
}
