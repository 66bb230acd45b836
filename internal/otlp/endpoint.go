package otlp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
)

// Endpoint is a parsed Config.Endpoint.
type Endpoint struct {
	Scheme string // http, https or unix
	Host   string // HOST:PORT; empty for unix
	Path   string // the socket, for unix
}

// ParseEndpoint parses an endpoint flag: http://HOST:PORT,
// https://HOST:PORT or unix:///PATH.
func ParseEndpoint(s string) (Endpoint, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Endpoint{}, fmt.Errorf("otlp: endpoint %q: want http://HOST:PORT, https://HOST:PORT or unix:///PATH (%w)", s, err)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Endpoint{}, fmt.Errorf("otlp: endpoint %q: no user, query or fragment (credentials go in --otlp-header)", s)
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") {
			return Endpoint{}, fmt.Errorf("otlp: endpoint %q: want %s://HOST:PORT", s, u.Scheme)
		}
		return Endpoint{Scheme: u.Scheme, Host: u.Host}, nil
	case "unix":
		if u.Host != "" || !strings.HasPrefix(u.Path, "/") {
			return Endpoint{}, fmt.Errorf("otlp: endpoint %q: want unix:///ABSOLUTE/PATH", s)
		}
		return Endpoint{Scheme: "unix", Path: u.Path}, nil
	}
	return Endpoint{}, fmt.Errorf("otlp: endpoint %q: want http://HOST:PORT, https://HOST:PORT or unix:///PATH", s)
}

func (e Endpoint) grpcTarget() string {
	if e.Scheme == "unix" {
		return "unix://" + e.Path
	}
	return "dns:///" + e.Host
}

func (e Endpoint) httpURL(path string) string {
	switch e.Scheme {
	case "unix":
		return "http://localhost" + path
	default:
		return e.Scheme + "://" + e.Host + path
	}
}

func (e Endpoint) httpClient(tlsConf *tls.Config, timeout time.Duration) *http.Client {
	tr := &http.Transport{TLSClientConfig: tlsConf, MaxIdleConns: 2, IdleConnTimeout: time.Minute, ResponseHeaderTimeout: timeout}
	d := &net.Dialer{Timeout: timeout}
	if e.Scheme == "unix" {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", e.Path) }
	} else {
		tr.DialContext = d.DialContext
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// tlsConfig is nil for a plaintext endpoint; for https the system's roots
// or CAFile, and the client certificate if given.
func tlsConfig(ep Endpoint, cfg Config) (*tls.Config, error) {
	if ep.Scheme != "https" {
		if cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" {
			return nil, fmt.Errorf("otlp: endpoint %q is plaintext: TLS files need https://", cfg.Endpoint)
		}
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := readBounded(cfg.CAFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("otlp: %s: no PEM certificate", cfg.CAFile)
		}
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("otlp: a client certificate needs both its cert and its key file")
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("otlp: client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// maxPEMBytes bounds a CA file.
const maxPEMBytes = 1 << 20

func readBounded(path string) ([]byte, error) {
	b, err := bounded.ReadFile(path, maxPEMBytes)
	if err != nil {
		return nil, fmt.Errorf("otlp: CA file: %w", err)
	}
	return b, nil
}
