package sweep

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// errEndedCapped: a daemon's ended activations were over a cap of Limits
// (records, pages or bytes).
var errEndedCapped = errors.New("ended activations over the cap")

// ListEnded reads every page of a daemon's ended activations with
// ListEndedActivations, oldest first, under ctx and limits: at most
// MaxEnded records in at most MaxEnded pages and MaxReplyBytes bytes in
// all. Past a cap it returns what it read with an error; so does a failed
// call.
func ListEnded(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, limits Limits) ([]*sandboxstatsv1.EndedActivation, error) {
	return readPages(ctx, client, limits.orDefault(), nil, "", 0, 0, true, nil)
}

// ListEndedLog is ListEnded with the daemon's ended log as of the last page
// read (nil when none was, or from a statsd older than the log).
func ListEndedLog(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, limits Limits) ([]*sandboxstatsv1.EndedActivation, *sandboxstatsv1.EndedLog, error) {
	var log *sandboxstatsv1.EndedLog
	ended, err := readPages(ctx, client, limits.orDefault(), nil, "", 0, 0, true, &log)
	return ended, log, err
}

// readEndedPages reads the pages after the records an answer of size bytes
// carried (ended, with its token; that answer counts as the first page),
// as ListEnded does, and returns every record: ended first.
func readEndedPages(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, limits Limits,
	ended []*sandboxstatsv1.EndedActivation, token string, bytes int) ([]*sandboxstatsv1.EndedActivation, error) {
	if err := endedCount(ended, limits); err != nil {
		return ended, err
	}
	return readPages(ctx, client, limits, ended, token, bytes, 1, false, nil)
}

// readPages follows token (from the first page when first) to the last
// page, appending to ended; bytes and pages count what was read already.
// With log set, it keeps there each page's ended log.
func readPages(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, limits Limits,
	ended []*sandboxstatsv1.EndedActivation, token string, bytes, pages int, first bool, log **sandboxstatsv1.EndedLog) ([]*sandboxstatsv1.EndedActivation, error) {
	ended = slices.Clip(ended) // never append into an answer's own array
	for ; first || token != ""; pages++ {
		first = false
		if pages == limits.MaxEnded {
			return ended, fmt.Errorf("%w: more than %d pages", errEndedCapped, limits.MaxEnded)
		}
		resp, err := client.ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{PageToken: token})
		if err != nil {
			return ended, err
		}
		if bytes += proto.Size(resp); bytes > limits.MaxReplyBytes {
			return ended, fmt.Errorf("%w: more than %d bytes", errEndedCapped, limits.MaxReplyBytes)
		}
		token = resp.GetNextPageToken()
		if log != nil && resp.GetEndedLog() != nil {
			*log = resp.GetEndedLog()
		}
		if len(resp.GetEnded()) == 0 && token != "" {
			return ended, fmt.Errorf("%w: a page with no record and a token for more", errEndedCapped)
		}
		ended = append(ended, resp.GetEnded()...)
		if err := endedCount(ended, limits); err != nil {
			return ended, err
		}
	}
	return ended, nil
}

// endedCount says whether ended is within limits.MaxEnded.
func endedCount(ended []*sandboxstatsv1.EndedActivation, limits Limits) error {
	if n := len(ended); n > limits.MaxEnded {
		return fmt.Errorf("%w: %d ended activations, over %d", errEndedCapped, n, limits.MaxEnded)
	}
	return nil
}
