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
	return readPages(ctx, client, limits.orDefault(), nil, "", 0, 0, true)
}

// readEndedPages reads the pages after the records an answer of size bytes
// carried (ended, with its token; that answer counts as the first page),
// as ListEnded does, and returns every record: ended first.
func readEndedPages(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, limits Limits,
	ended []*sandboxstatsv1.EndedActivation, token string, bytes int) ([]*sandboxstatsv1.EndedActivation, error) {
	if err := endedCount(ended, limits); err != nil {
		return ended, err
	}
	return readPages(ctx, client, limits, ended, token, bytes, 1, false)
}

// readPages follows token (from the first page when first) to the last
// page, appending to ended; bytes and pages count what was read already.
func readPages(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, limits Limits,
	ended []*sandboxstatsv1.EndedActivation, token string, bytes, pages int, first bool) ([]*sandboxstatsv1.EndedActivation, error) {
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
