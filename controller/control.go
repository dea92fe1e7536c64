package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller/instancerecovery"
	"hvguard/controller/recovery"
	"hvguard/fencing/natslease"
)

// ControlBucket is the controllers' own bucket: the leader lock
// (LeaderKey) and the guard's authoritative copy (fencing.GuardKey; the
// lease bucket holds the copy the agents read). With the shipped NATS
// accounts it lives, like the memory and the recovery buckets, in the
// controllers' account (natsperm.ControlAccount), where no agent has a
// user: a JetStream API answer is published in the requester's account,
// so an agent's "reflected" writes (reviewer X12: a direct get whose reply
// subject is a key it is denied) land in the agents' account only.
const ControlBucket = "hvguard-control"

// kvBucket is one of the controllers' buckets: how to open, create and
// provision it.
type kvBucket struct {
	what string // for errors: "recovery bucket"
	cfg  jetstream.KeyValueConfig
}

// ensure opens b (or, with create, creates it with b.cfg and one
// replica). An existing bucket's configuration is never changed.
func (b kvBucket) ensure(ctx context.Context, js jetstream.JetStream, create bool) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, b.cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) || !create {
		return nil, fmt.Errorf("%s %s: %w (provision it with: nats kv add %s --history %d --storage file --replicas 3 && nats stream edit KV_%s --no-allow-rollup --no-allow-direct --deny-purge --deny-delete -f)",
			b.what, b.cfg.Bucket, err, b.cfg.Bucket, b.cfg.History, b.cfg.Bucket)
	}
	cfg := b.cfg
	cfg.Storage = jetstream.FileStorage
	// No rollups, no direct gets (readers have users in this account:
	// natsperm.kvRead).
	if kv, err = natslease.CreateHardened(ctx, js, cfg); err != nil {
		return nil, fmt.Errorf("%s %s: %w", b.what, b.cfg.Bucket, err)
	}
	return kv, nil
}

var (
	controlBucket = kvBucket{"control bucket", jetstream.KeyValueConfig{Bucket: ControlBucket, History: 1,
		Description: "hvguard-controller: the leader lock (_leader) and the mass-failure guard (_guard)"}}
	memoryBucket = kvBucket{"controller memory bucket", jetstream.KeyValueConfig{Bucket: MemoryBucket, History: 1,
		Description: "hvguard-controller memory: per host token, whether its beacons bound it"}}
	recoveryBucket = kvBucket{"recovery bucket", jetstream.KeyValueConfig{Bucket: recovery.Bucket, History: 5,
		Description: "hvguard host recovery progress (controller/recovery.Record per host token)"}}
	instanceBucket = kvBucket{"instance recovery bucket", jetstream.KeyValueConfig{Bucket: instancerecovery.Bucket, History: 5,
		Description: "hvguard-controller instance recovery: per instance, the stops decided and the actions taken"}}
)

// EnsureControlBucket opens (or, with create, creates: file storage, one
// value per key) the control bucket (ControlBucket).
func EnsureControlBucket(ctx context.Context, js jetstream.JetStream, create bool) (jetstream.KeyValue, error) {
	return controlBucket.ensure(ctx, js, create)
}

// EnsureMemoryBucket opens (or, with create, creates: file storage, one
// value per key) the controllers' memory bucket (MemoryBucket).
func EnsureMemoryBucket(ctx context.Context, js jetstream.JetStream, create bool) (jetstream.KeyValue, error) {
	return memoryBucket.ensure(ctx, js, create)
}

// EnsureRecoveryBucket opens (or, with create, creates with one replica
// and a short history) the bucket of the recoveries' progress.
func EnsureRecoveryBucket(ctx context.Context, js jetstream.JetStream, create bool) (jetstream.KeyValue, error) {
	return recoveryBucket.ensure(ctx, js, create)
}

// EnsureInstanceBucket opens (or, with create, creates: one replica, file
// storage, history 5 for forensics) the instance recovery bucket.
func EnsureInstanceBucket(ctx context.Context, js jetstream.JetStream, create bool) (jetstream.KeyValue, error) {
	return instanceBucket.ensure(ctx, js, create)
}

// ControlBuckets are the buckets of the controllers' account every
// controller opens (or creates) at start (EnsureControlBuckets); the
// instance recovery bucket, in the same account, is opened only when
// instance recovery runs.
type ControlBuckets struct {
	Control, Memory, Recovery jetstream.KeyValue
}

// EnsureControlBuckets opens (or, with create, creates) the control,
// memory and recovery buckets on js (the controllers' account).
func EnsureControlBuckets(ctx context.Context, js jetstream.JetStream, create bool) (ControlBuckets, error) {
	var b ControlBuckets
	var err error
	for _, x := range []struct {
		kv  *jetstream.KeyValue
		def kvBucket
	}{{&b.Control, controlBucket}, {&b.Memory, memoryBucket}, {&b.Recovery, recoveryBucket}} {
		if *x.kv, err = x.def.ensure(ctx, js, create); err != nil {
			return ControlBuckets{}, err
		}
	}
	return b, nil
}
