package otlp

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Endpoint
		wantErr string
	}{
		{in: "http://127.0.0.1:4317", want: Endpoint{Scheme: "http", Host: "127.0.0.1:4317"}},
		{in: "https://collector.example:4318", want: Endpoint{Scheme: "https", Host: "collector.example:4318"}},
		{in: "http://[::1]:4317/", want: Endpoint{Scheme: "http", Host: "[::1]:4317"}},
		{in: "unix:///run/otel/otlp.sock", want: Endpoint{Scheme: "unix", Path: "/run/otel/otlp.sock"}},
		{in: "127.0.0.1:4317", wantErr: "want http://HOST:PORT"},
		{in: "http://127.0.0.1", wantErr: "want http://HOST:PORT"},
		{in: "http://127.0.0.1:4318/v1/metrics", wantErr: "want http://HOST:PORT"},
		{in: "unix://relative/path", wantErr: "want unix:///ABSOLUTE/PATH"},
		{in: "grpc://127.0.0.1:4317", wantErr: "want http://HOST:PORT"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseEndpoint(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
