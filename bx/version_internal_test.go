package bx

import (
	"crypto/hmac"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// TestHandshakeVersion: ends of different wire versions refuse each other
// at the handshake, before any QP is made, and both say which versions
// met. The peers of another version are written here byte by byte: one of
// wire version 6 or older (no version in its hello or auth, as bx sent
// them before version 7) and one of a later version. The first case, two
// ends of this version, shows the other cases' peers could connect.
func TestHandshakeVersion(t *testing.T) {
	tok := []byte("0123456789abcdef-version")
	const d = 2 * time.Second
	// withVersion is body with version v after it, or body alone for a
	// peer of wire version 6 or older (v 0).
	withVersion := func(body []byte, v uint8) []byte {
		if v == 0 {
			return body
		}
		return append(append([]byte(nil), body...), v)
	}
	// acceptor is the accepting side of version v: a hello, then it
	// reads the dialer's answer and, if it is an auth, checks its MAC and
	// answers as bx does. It returns the dialer's answer.
	acceptor := func(v uint8) func(c net.Conn) (ctlMsg, error) {
		return func(c net.Conn) (ctlMsg, error) {
			sn := nonce()
			if err := writeCtl(c, ctlHello, withVersion(sn, v), d); err != nil {
				return ctlMsg{}, err
			}
			m, err := readCtl(c, d)
			if err != nil || m.Type != ctlAuth {
				return m, err
			}
			if m.Version != v {
				return m, fmt.Errorf("the dialer named version %d in its auth, the acceptor %d", m.Version, v)
			}
			if !hmac.Equal(m.MAC, mac(tok, "bx client", sn, m.Nonce)) {
				return m, errors.New("the dialer's MAC is wrong")
			}
			return m, writeCtl(c, ctlAuthOK, mac(tok, "bx server", sn, m.Nonce), d)
		}
	}
	// dialer is the dialing side of version v: it answers the hello with
	// an auth and returns what the acceptor answers to that.
	dialer := func(v uint8) func(c net.Conn) (ctlMsg, error) {
		return func(c net.Conn) (ctlMsg, error) {
			m, err := readCtl(c, d)
			if err != nil {
				return m, err
			}
			if m.Type != ctlHello {
				return m, fmt.Errorf("got control message %d, want a hello", m.Type)
			}
			cn := nonce()
			body := append(append([]byte(nil), cn...), mac(tok, "bx client", m.Nonce, cn)...)
			if err := writeCtl(c, ctlAuth, withVersion(body, v), d); err != nil {
				return ctlMsg{}, err
			}
			return readCtl(c, d)
		}
	}
	ours := func(acc bool) func(net.Conn) error {
		if acc {
			return func(c net.Conn) error { return authServer(c, tok, d) }
		}
		return func(c net.Conn) error { return authClient(c, tok, d) }
	}
	// theirs runs f as the other version's side and checks what it got:
	// a bye whose reason says why.
	theirs := func(t *testing.T, f func(net.Conn) (ctlMsg, error), why string) func(net.Conn) error {
		return func(c net.Conn) error {
			m, err := f(c)
			if err != nil {
				return err
			}
			if m.Type != ctlBye || m.Reason != why {
				t.Errorf("the other version's side got control message %d (reason %q), want a bye saying %q", m.Type, m.Reason, why)
			}
			return nil
		}
	}
	t.Run("same", func(t *testing.T) {
		aerr, berr := loopback(t, ours(true), ours(false))
		if aerr != nil || berr != nil {
			t.Fatalf("acceptor: %v; dialer: %v", aerr, berr)
		}
		// The peers the other cases use, at our version, connect too.
		aerr, berr = loopback(t, ours(true), func(c net.Conn) error {
			m, err := dialer(wireVersion)(c)
			if err == nil && m.Type != ctlAuthOK {
				err = fmt.Errorf("got control message %d, want auth ok", m.Type)
			}
			return err
		})
		if aerr != nil || berr != nil {
			t.Fatalf("acceptor: %v; written dialer: %v", aerr, berr)
		}
		aerr, berr = loopback(t, func(c net.Conn) error { _, err := acceptor(wireVersion)(c); return err }, ours(false))
		if aerr != nil || berr != nil {
			t.Fatalf("written acceptor: %v; dialer: %v", aerr, berr)
		}
	})
	for _, v := range []uint8{0, wireVersion - 1, wireVersion + 1} {
		name := fmt.Sprint(v)
		if v == 0 {
			name = "6 or older"
		}
		t.Run("dialer "+name, func(t *testing.T) {
			why := fmt.Sprintf("the acceptor's bx speaks wire version %d, the dialer's %s: both ends must run the same bx wire version", wireVersion, name)
			aerr, berr := loopback(t, ours(true), theirs(t, dialer(v), why))
			if berr != nil {
				t.Fatalf("the dialer of version %s: %v", name, berr)
			}
			if !errors.Is(aerr, ErrProtocol) || !strings.Contains(aerr.Error(), why) {
				t.Fatalf("acceptor: %v, want ErrProtocol saying %q", aerr, why)
			}
		})
		t.Run("acceptor "+name, func(t *testing.T) {
			why := fmt.Sprintf("the acceptor's bx speaks wire version %s, the dialer's %d: both ends must run the same bx wire version", name, wireVersion)
			aerr, berr := loopback(t, theirs(t, acceptor(v), why), ours(false))
			if aerr != nil {
				t.Fatalf("the acceptor of version %s: %v", name, aerr)
			}
			if !errors.Is(berr, ErrProtocol) || !strings.Contains(berr.Error(), why) {
				t.Fatalf("dialer: %v, want ErrProtocol saying %q", berr, why)
			}
		})
	}
	// A bx of wire version 6 or older hangs up on our hello (33 bytes,
	// where it takes 32): the acceptor says what that likely is.
	t.Run("dialer hangs up", func(t *testing.T) {
		aerr, berr := loopback(t, ours(true), func(c net.Conn) error {
			_, err := readCtl(c, d)
			c.Close()
			return err
		})
		if berr != nil {
			t.Fatal(berr)
		}
		if want := fmt.Sprintf("the dialer hung up after our hello (a bx older than wire version %d", wireVersion); aerr == nil || !strings.Contains(aerr.Error(), want) {
			t.Fatalf("acceptor: %v, want it to say %q", aerr, want)
		}
	})
	// A wrong token is still ErrAuth, whatever the versions: the MAC is
	// checked first, so nothing but "no" reaches an impostor.
	t.Run("wrong token", func(t *testing.T) {
		aerr, berr := loopback(t, ours(true), func(c net.Conn) error { return authClient(c, []byte("another-token-of-16+bytes"), d) })
		if !errors.Is(aerr, ErrAuth) || !errors.Is(berr, ErrAuth) {
			t.Fatalf("acceptor: %v; dialer: %v; want ErrAuth both", aerr, berr)
		}
	})
}

// loopback runs acc on the accepted end and dial on the dialing end of a
// loopback TCP connection and returns their errors. The dialing end is
// closed once acc returned, or at once if dial failed (so that acc is not
// left waiting for it).
func loopback(t *testing.T, acc, dial func(net.Conn) error) (aerr, derr error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		done <- acc(c)
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if derr = dial(c); derr != nil {
		c.Close()
	}
	return <-done, derr
}
