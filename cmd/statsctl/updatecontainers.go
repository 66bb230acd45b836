package main

import (
	"context"
	"fmt"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// runUpdateContainers replaces the bound actor's container set
// (UpdateWorkloadContainers): the epoch stays.
func runUpdateContainers(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "update-containers", "Replace the bound workload's container set; the activation and its epoch stay (launcher side)")
	var (
		conn       connFlags
		actorUID   string
		containers containersFlag
	)
	conn.registerLifecycle(fs)
	fs.StringVar(&actorUID, "actor-uid", "", "the bound actor (required)")
	fs.Var(&containers, "container", containerUsage+"; the whole set now")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	ctx, cc, done, err := conn.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := sandboxstatsv1.NewWorkloadLifecycleServiceClient(cc).UpdateWorkloadContainers(ctx,
		&sandboxstatsv1.UpdateWorkloadContainersRequest{ActorUid: actorUID, Containers: containers})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "updated %s: %d container(s), epoch %s\n", actorUID, len(containers), formatTime(resp.GetEpochUnixNano()))
	return nil
}
