package nodeagent

import (
	"bytes"
	"net/http"
	"slices"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// scrapeHandler serves /metrics. The sweep's families (sweepGatherer's
// sweep registry) are encoded once per sweep and format, and compressed
// once per sweep for gzip; the live registry's (Go and process
// collectors, discovery failures, the OTLP pipeline's, promhttp's errors)
// are gathered and encoded at every scrape and merged in by name, so a
// scrape shows them at their value as of the scrape. The body is the one
// promhttp writes for the same families (text byte for byte; gzip the same
// text in one gzip member, compressed in pieces).
//
// Negotiation is promhttp's: the format is expfmt.NegotiateAccept over
// expfmt.DefaultAcceptedFormats (no OpenMetrics: an OpenMetrics-only
// Accept gets text 0.0.4, protobuf gets protobuf), and the encoding is
// learnt from full, today's promhttp handler, which serves the first scrape
// of each Accept-Encoding value and everything the cache does not take
// (name[] filters, gather errors, names both registries use, more distinct
// formats or Accept-Encoding values than the bounds).
type scrapeHandler struct {
	full   http.Handler
	gather *sweepGatherer

	mu        sync.Mutex
	key       *snapshot                    // the snapshot bodies were encoded at
	bodies    map[expfmt.Format]*sweepBody // at most maxScrapeFormats
	encodings map[string]string            // Accept-Encoding values -> the encoding promhttp chose; at most maxScrapeEncodings
}

const (
	maxScrapeFormats   = 2 // encoded bodies kept per sweep (Prometheus asks one)
	maxScrapeEncodings = 8 // distinct Accept-Encoding values remembered
)

// sweepBody is the sweep's families encoded in one format.
type sweepBody struct {
	names []string // family names, sorted
	text  []byte   // the families encoded one after another
	ends  []int    // ends[i]: where family i ends in text
	gz    *gzipPieces
}

// span is families [from, to) of text.
func (b *sweepBody) span(from, to int) []byte {
	start := 0
	if from > 0 {
		start = b.ends[from-1]
	}
	return b.text[start:b.ends[to-1]]
}

func newScrapeHandler(full http.Handler, g *sweepGatherer) *scrapeHandler {
	return &scrapeHandler{full: full, gather: g, encodings: map[string]string{}}
}

func (h *scrapeHandler) ServeHTTP(rsp http.ResponseWriter, req *http.Request) {
	if req.URL != nil && len(req.URL.Query()["name[]"]) > 0 {
		h.full.ServeHTTP(rsp, req)
		return
	}
	aeKey := strings.Join(req.Header.Values("Accept-Encoding"), "\n")
	h.mu.Lock()
	enc, known := h.encodings[aeKey]
	h.mu.Unlock()
	if !known {
		h.learn(rsp, req, aeKey)
		return
	}
	format := expfmt.NegotiateAccept(req.Header, expfmt.DefaultAcceptedFormats()...) // as promhttp does
	body := h.body(format)
	if body == nil {
		h.full.ServeHTTP(rsp, req)
		return
	}
	live, err := h.gather.live.Gather()
	if err != nil {
		h.full.ServeHTTP(rsp, req) // it counts the error and serves what it can
		return
	}
	pieces, ok := merge(body, live, format)
	if !ok {
		h.full.ServeHTTP(rsp, req)
		return
	}
	hdr := rsp.Header()
	hdr.Add("Vary", "Accept")
	hdr.Add("Vary", "Accept-Encoding")
	hdr.Set("Content-Type", string(format))
	if enc == "gzip" {
		hdr.Set("Content-Encoding", enc)
		h.writeGzip(rsp, body, pieces)
		return
	}
	for _, p := range pieces {
		if _, err := rsp.Write(p.bytes(body)); err != nil {
			return
		}
	}
}

// learn serves req through promhttp and remembers the encoding it chose
// for this Accept-Encoding value (when it answered 200 with an encoding
// the cache writes).
func (h *scrapeHandler) learn(rsp http.ResponseWriter, req *http.Request, aeKey string) {
	sw := &statusWriter{ResponseWriter: rsp}
	h.full.ServeHTTP(sw, req)
	if sw.code != 0 && sw.code != http.StatusOK {
		return
	}
	enc := cmpOr(rsp.Header().Get("Content-Encoding"), "identity")
	if enc != "identity" && enc != "gzip" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.encodings) < maxScrapeEncodings {
		h.encodings[aeKey] = enc
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// body returns the sweep's families encoded in format, encoding them if
// this sweep has not been scraped in it yet; nil when the cache does not
// take it (a gather or encoding error, OpenMetrics, too many formats).
func (h *scrapeHandler) body(format expfmt.Format) *sweepBody {
	if format.FormatType() == expfmt.TypeOpenMetrics {
		return nil // its encoder ends the body (# EOF): not a concatenation
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	snap, fams, err := h.gather.sweepFamilies()
	if err != nil {
		return nil
	}
	if snap != h.key {
		h.key, h.bodies = snap, map[expfmt.Format]*sweepBody{}
	}
	if b, ok := h.bodies[format]; ok {
		return b
	}
	if len(h.bodies) >= maxScrapeFormats {
		return nil
	}
	b := &sweepBody{names: make([]string, len(fams)), ends: make([]int, len(fams))}
	if !encodeText(b, fams, format) {
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, format)
		for i, f := range fams {
			if err := enc.Encode(f); err != nil {
				return nil
			}
			b.names[i], b.ends[i] = f.GetName(), buf.Len()
		}
		b.text = slices.Clip(buf.Bytes())
	}
	if !slices.IsSorted(b.names) {
		return nil
	}
	h.bodies[format] = b
	return b
}

// encodeText encodes fams into b with appendText when format is the text
// format and appendText writes every family; false leaves b to expfmt.
func encodeText(b *sweepBody, fams []*dto.MetricFamily, format expfmt.Format) bool {
	if format.FormatType() != expfmt.TypeTextPlain {
		return false
	}
	text, legal := make([]byte, 0, 4096), map[string]bool{}
	for i, f := range fams {
		var ok bool
		if text, ok = appendText(text, f, legal); !ok {
			return false
		}
		b.names[i], b.ends[i] = f.GetName(), len(text)
	}
	b.text = slices.Clip(text)
	return true
}

// piece is a run of the sweep's families (live == nil) or one live
// family, encoded.
type piece struct {
	from, to int // the sweep's families [from, to)
	live     []byte
}

func (p piece) bytes(b *sweepBody) []byte {
	if p.live != nil {
		return p.live
	}
	return b.span(p.from, p.to)
}

// merge orders the sweep's families and the live ones by name, as
// sweepGatherer.Gather does; false if a name is in both or a live family
// does not encode.
func merge(b *sweepBody, live []*dto.MetricFamily, format expfmt.Format) ([]piece, bool) {
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, format)
	pieces := make([]piece, 0, 2*len(live)+1)
	next := 0 // the first sweep family not yet in pieces
	for _, f := range live {
		at, found := slices.BinarySearch(b.names, f.GetName())
		if found {
			return nil, false
		}
		if at > next {
			pieces = append(pieces, piece{from: next, to: at})
			next = at
		}
		start := buf.Len()
		if err := enc.Encode(f); err != nil {
			return nil, false
		}
		pieces = append(pieces, piece{live: buf.Bytes()[start:buf.Len():buf.Len()]})
	}
	if next < len(b.names) {
		pieces = append(pieces, piece{from: next, to: len(b.names)})
	}
	// buf may have grown (and moved) since the first live slices were
	// taken: take them again from the final buffer.
	off := 0
	for i := range pieces {
		if p := pieces[i].live; p != nil {
			pieces[i].live = buf.Bytes()[off : off+len(p) : off+len(p)]
			off += len(p)
		}
	}
	return pieces, true
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}
