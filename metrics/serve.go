package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// NewRegistry returns a registry with the Go runtime and process
// collectors and cs (usually one Collector).
func NewRegistry(cs ...prometheus.Collector) (*prometheus.Registry, error) {
	r := prometheus.NewRegistry()
	cs = append([]prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}, cs...)
	for i, c := range cs {
		if isNil(c) {
			return nil, fmt.Errorf("metrics: collector %d is nil", i-2)
		}
		if err := r.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return r, nil
}

// Serve serves g's metrics over HTTP at addr (host:port) on /metrics, in
// the Prometheus exposition formats, until stop is called. stop shuts the
// server down (waiting up to 2 s for scrapes in progress) and is
// idempotent.
func Serve(addr string, g prometheus.Gatherer) (stop func(), err error) {
	if addr == "" {
		return nil, errors.New("metrics: Serve: empty address")
	}
	if isNil(g) {
		return nil, errors.New("metrics: Serve: nil Gatherer")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	stop, err = ServeListener(ln, g)
	if err != nil {
		ln.Close()
	}
	return stop, err
}

// ServeListener is Serve on a listener the caller made (to learn the port
// of "host:0", say). stop also closes ln.
func ServeListener(ln net.Listener, g prometheus.Gatherer) (stop func(), err error) {
	if isNil(ln) {
		return nil, errors.New("metrics: ServeListener: nil listener")
	}
	if isNil(g) {
		return nil, errors.New("metrics: ServeListener: nil Gatherer")
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, "goverbs metrics: /metrics\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if srv.Shutdown(ctx) != nil {
				srv.Close()
			}
			<-done
		})
	}, nil
}

// Scraped is a Gatherer of another process's metrics endpoint (url, e.g.
// http://127.0.0.1:9464/metrics): each Gather reads its goverbs_ metrics
// in the text format and adds labels to every series, e.g.
// {"process": "worker1"}, so that a parent can serve its children's
// metrics on one endpoint (prometheus.Gatherers). Other families (go_,
// process_) are left out: the parent has its own. A series that has one
// of the labels already (a child that serves its own children's) keeps
// its value as exported_NAME, as a Prometheus server does with a
// target's labels. Scraped copies labels; it refuses a name that is not
// a valid label name, starts with "__" or is "le" or "quantile" (the
// histogram's and summary's own), and a value that is not valid UTF-8.
func Scraped(url string, labels map[string]string) (prometheus.Gatherer, error) {
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("metrics: Scraped: %q is not an http(s) URL", url)
	}
	own := make(map[string]string, len(labels))
	for k, v := range labels {
		if !model.LegacyValidation.IsValidLabelName(k) || strings.HasPrefix(k, "__") || k == "le" || k == "quantile" {
			return nil, fmt.Errorf("metrics: Scraped: invalid label name %q", k)
		}
		if !utf8.ValidString(v) {
			return nil, fmt.Errorf("metrics: Scraped: label %s: value %q is not valid UTF-8", k, v)
		}
		own[k] = v
	}
	return scraped{url: url, labels: own}, nil
}

type scraped struct {
	url    string
	labels map[string]string
}

func (s scraped) Gather() ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: scrape %s: %w", s.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: scrape %s: %s", s.url, resp.Status)
	}
	return s.parse(resp.Body)
}

// parse is Gather's reading of what the endpoint answered.
func (s scraped) parse(r io.Reader) ([]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics: scrape %s: %w", s.url, err)
	}
	var out []*dto.MetricFamily
	for name, f := range fams {
		if !strings.HasPrefix(name, "goverbs_") {
			continue
		}
		for _, m := range f.Metric {
			s.relabel(m)
		}
		out = append(out, f)
	}
	return out, nil
}

// relabel adds s.labels to m, renaming a label of m's that has one of
// their names to exported_NAME (exported_exported_NAME if that is taken
// too, ...): two labels of one name make the text format unparsable. The
// labels end sorted by name.
func (s scraped) relabel(m *dto.Metric) {
	taken := func(name string) bool {
		_, ours := s.labels[name]
		return ours || slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == name })
	}
	for _, l := range m.Label {
		if _, ok := s.labels[l.GetName()]; ok {
			n := "exported_" + l.GetName()
			for taken(n) {
				n = "exported_" + n
			}
			l.Name = &n
		}
	}
	for k, v := range s.labels {
		m.Label = append(m.Label, &dto.LabelPair{Name: &k, Value: &v})
	}
	slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
}
