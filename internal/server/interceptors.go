package server

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// UnaryInterceptors returns logging then panic recovery (recovery last, so it
// sits closest to the handler): grpc-go does not recover handler panics, and a
// daemon polled on a timer must not die of one.
func UnaryInterceptors(logger *slog.Logger) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(loggingInterceptor(logger), recoveryInterceptor(logger))
}

func loggingInterceptor(logger *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		logger.Debug("rpc", "method", info.FullMethod, "code", status.Code(err).String(), "duration", time.Since(start))
		return resp, err
	}
}

func recoveryInterceptor(logger *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				logger.Error("handler panic", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
				resp, err = nil, status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
			}
		}()
		return handler(ctx, req)
	}
}
