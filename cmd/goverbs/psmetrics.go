package main

import (
	"fmt"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goverbs/goverbs/metrics"
)

// --metrics of ps serve, worker and bench: a Prometheus endpoint (package
// metrics) for the life of the command.

// checkMetricsAddr validates a --metrics value (host:port; port 0 picks
// one).
func checkMetricsAddr(addr string) error {
	if addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usageError("--metrics %q: want HOST:PORT (%v)", addr, err)
	}
	return nil
}

// startMetrics serves a registry of c (with the Go and process collectors)
// and the extra gatherers on addr; labels, if any, are added to c's
// series. It returns the /metrics URL.
func startMetrics(addr string, c *metrics.Collector, labels prometheus.Labels, extra ...prometheus.Gatherer) (url string, stop func(), err error) {
	reg, err := metrics.NewRegistry()
	if err != nil {
		return "", nil, err
	}
	if err := prometheus.WrapRegistererWith(labels, reg).Register(c); err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics: %w", err)
	}
	var g prometheus.Gatherer = reg
	if len(extra) > 0 {
		g = append(prometheus.Gatherers{reg}, extra...)
	}
	stop, err = metrics.ServeListener(ln, g)
	if err != nil {
		ln.Close()
		return "", nil, err
	}
	return "http://" + ln.Addr().String() + "/metrics", stop, nil
}
