package bx

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"
)

// TestPKI is a throw-away certificate authority with a server and a
// client certificate for the name "bx.test" (and the test addresses), and
// a second authority nobody trusts.
type TestPKI struct {
	Pool                     *x509.CertPool
	Server, Client, Stranger tls.Certificate
}

// NewTestPKI makes the certificates.
func NewTestPKI(t testing.TB) *TestPKI {
	t.Helper()
	ca, caKey := testCert(t, "bx test CA", nil, nil)
	other, otherKey := testCert(t, "bx other CA", nil, nil)
	pk := &TestPKI{Pool: x509.NewCertPool()}
	pk.Pool.AddCert(ca.Leaf)
	pk.Server, _ = testCert(t, "bx.test", ca.Leaf, caKey)
	pk.Client, _ = testCert(t, "bx client", ca.Leaf, caKey)
	pk.Stranger, _ = testCert(t, "bx.test", other.Leaf, otherKey)
	return pk
}

// Config is an endpoint's TLS configuration with cert: it requires and
// verifies peers' certificates against the test authority both ways.
func (pk *TestPKI) Config(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pk.Pool, ClientCAs: pk.Pool,
		ClientAuth: tls.RequireAndVerifyClientCert, ServerName: "bx.test", MinVersion: tls.VersionTLS13}
}

func testCert(t testing.TB, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (tls.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"bx.test"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 99, 0, 1), net.IPv4(10, 99, 0, 2)},
	}
	signer, signKey := tmpl, key
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	} else {
		signer, signKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, key
}

// TestControlTLS runs the control plane's TLS and token steps over
// loopback TCP (no RDMA device needed): mutual authentication, a client
// or a server with a certificate of another authority, TLS on one end
// only, and a wrong token inside TLS.
func TestControlTLS(t *testing.T) {
	pk := NewTestPKI(t)
	tok := []byte("0123456789abcdef-tls")
	ep := func(c *tls.Config, token []byte) *Endpoint {
		return &Endpoint{cfg: Config{TLS: c, Token: token, HandshakeTimeout: 2 * time.Second}}
	}
	// run dials srv from cli and returns both sides' errors; on success
	// it checks a control message crosses.
	run := func(t *testing.T, srv, cli *Endpoint) (serr, cerr error) {
		return loopback(t, func(c net.Conn) error {
			if err := srv.checkServerTLS(); err != nil {
				return err
			}
			c, err := srv.secureServer(context.Background(), c)
			if err != nil {
				return err
			}
			if err := authServer(c, srv.cfg.Token, time.Second); err != nil {
				return err
			}
			m, err := readCtl(c, time.Second)
			if err == nil && m.Type != ctlPing {
				err = errors.New("not a ping")
			}
			return err
		}, func(raw net.Conn) error {
			c, err := cli.secureClient(context.Background(), raw, raw.RemoteAddr().String())
			if err != nil {
				return err
			}
			if err = authClient(c, cli.cfg.Token, time.Second); err == nil {
				err = writeCtl(c, ctlPing, nil, time.Second)
			}
			if _, ok := c.(*tls.Conn); ok != (cli.cfg.TLS != nil) {
				t.Errorf("control connection TLS %v, Config.TLS set %v", ok, cli.cfg.TLS != nil)
			}
			return err
		})
	}
	t.Run("mutual", func(t *testing.T) {
		serr, cerr := run(t, ep(pk.Config(pk.Server), tok), ep(pk.Config(pk.Client), tok))
		if serr != nil || cerr != nil {
			t.Fatalf("server %v, client %v", serr, cerr)
		}
	})
	t.Run("plain", func(t *testing.T) {
		serr, cerr := run(t, ep(nil, tok), ep(nil, tok))
		if serr != nil || cerr != nil {
			t.Fatalf("server %v, client %v", serr, cerr)
		}
	})
	t.Run("client-stranger", func(t *testing.T) {
		serr, cerr := run(t, ep(pk.Config(pk.Server), tok), ep(pk.Config(pk.Stranger), tok))
		t.Logf("server: %v\nclient: %v", serr, cerr)
		if !errors.Is(serr, ErrTLS) || !strings.Contains(serr.Error(), "certificate") {
			t.Errorf("server: %v, want ErrTLS about the certificate", serr)
		}
		if !errors.Is(cerr, ErrTLS) {
			t.Errorf("client: %v, want ErrTLS", cerr)
		}
	})
	t.Run("server-stranger", func(t *testing.T) {
		serr, cerr := run(t, ep(pk.Config(pk.Stranger), tok), ep(pk.Config(pk.Client), tok))
		t.Logf("server: %v\nclient: %v", serr, cerr)
		if !errors.Is(cerr, ErrTLS) || !strings.Contains(cerr.Error(), "certificate") {
			t.Errorf("client: %v, want ErrTLS about the certificate", cerr)
		}
	})
	t.Run("tls-client-plain-server", func(t *testing.T) {
		_, cerr := run(t, ep(nil, tok), ep(pk.Config(pk.Client), tok))
		t.Logf("client: %v", cerr)
		if !errors.Is(cerr, ErrTLS) || !strings.Contains(cerr.Error(), "does not speak TLS") {
			t.Errorf("client: %v, want ErrTLS saying the peer does not speak TLS", cerr)
		}
	})
	t.Run("plain-client-tls-server", func(t *testing.T) {
		serr, cerr := run(t, ep(pk.Config(pk.Server), tok), ep(nil, tok))
		t.Logf("server: %v\nclient: %v", serr, cerr)
		if cerr == nil || !strings.Contains(cerr.Error(), "TLS") {
			t.Errorf("client: %v, want an error that mentions TLS", cerr)
		}
	})
	t.Run("wrong-token-in-tls", func(t *testing.T) {
		_, cerr := run(t, ep(pk.Config(pk.Server), tok), ep(pk.Config(pk.Client), []byte("another-token-of-16+bytes")))
		if !errors.Is(cerr, ErrAuth) {
			t.Errorf("client: %v, want ErrAuth", cerr)
		}
	})
	t.Run("no-certificate", func(t *testing.T) {
		if err := ep(&tls.Config{}, tok).checkServerTLS(); err == nil {
			t.Error("a TLS config without a certificate accepted for Listen")
		}
	})
}
