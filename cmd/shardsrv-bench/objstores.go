package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"golang.org/x/sync/errgroup"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/azstore"
	"github.com/shardsrv/shardsrv/internal/azstore/aztest"
	"github.com/shardsrv/shardsrv/internal/gcsstore"
	"github.com/shardsrv/shardsrv/internal/gcsstore/gcstest"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// The SDK downloads the store scenarios compare with: 8 MiB parts, 8 in flight.
const sdkPart, sdkConcurrency = 8 << 20, 8

// objectStoreScenarios: one 512 MiB direct shard from the GCS and Azure emulators, through
// shardsrv (curl the client, the digest declined and on) against the same SDK's parallel ranged
// download of the same bytes, alternated in the same run, and the store stage alone.
func objectStoreScenarios(r *report, bin, dir string) {
	big := safetensorsFile(safetensors.TensorData{Name: "w", DType: "BF16", Shape: []int64{bigRows, bigCols},
		Data: randomBytes(bigRows*bigCols*2, 4)})
	sc := objectStoreScenario{size: int64(bigRows * bigCols * 2), key: "big/model.safetensors",
		request: bigSlab(bigRows)}
	sc.start = int64(len(big)) - sc.size
	ctx := context.Background()
	if want("gcs") {
		if gcsBin, err := gcstest.Binary(); err != nil {
			log.Printf("fake-gcs-server not found (make tools): skipping the GCS scenario")
		} else {
			must(os.MkdirAll(filepath.Join(dir, "gcs"), 0o755))
			s, err := gcstest.Run(gcsBin, filepath.Join(dir, "gcs"))
			must(err)
			defer s.Stop()
			must(s.Client.Bucket(bucket).Create(ctx, "bench", nil))
			log.Printf("uploading 512 MiB to fake-gcs-server")
			must(s.PutErr(bucket, sc.key, big))
			obj := s.Client.Bucket(bucket).Object(sc.key)
			sdk := func() {
				parallel(sc.size, func(ctx context.Context, off, n int64, p []byte) error {
					rd, err := obj.NewRangeReader(ctx, sc.start+off, n)
					if err != nil {
						return err
					}
					defer rd.Close()
					_, err = io.ReadFull(rd, p)
					return err
				})
			}
			st, err := gcsstore.New(ctx, gcsstore.Config{Bucket: bucket, Endpoint: s.Endpoint})
			must(err)
			srv := startServerEnv(bin, "gs://"+bucket, nil, "--gcs-endpoint", s.Endpoint, "--cache-bytes", "0")
			sc.run(r, "GCS (fake-gcs-server on loopback)", "Go storage SDK", srv, sdk, st)
		}
	}
	if want("azure") {
		azBin, err := aztest.Binary()
		if err != nil {
			log.Printf("azurite-blob not found (make tools): skipping the Azure scenario")
			return
		}
		must(os.MkdirAll(filepath.Join(dir, "azure"), 0o755))
		s, err := aztest.Run(azBin, filepath.Join(dir, "azure"))
		must(err)
		defer s.Stop()
		_, err = s.Client.CreateContainer(ctx, bucket, nil)
		must(err)
		log.Printf("uploading 512 MiB to Azurite")
		must(s.PutErr(bucket, sc.key, big))
		buf := make([]byte, sc.size)
		sdk := func() {
			_, err := s.Client.DownloadBuffer(ctx, bucket, sc.key, buf, &azblob.DownloadBufferOptions{
				Range: azblob.HTTPRange{Offset: sc.start, Count: sc.size}, BlockSize: sdkPart, Concurrency: sdkConcurrency})
			must(err)
		}
		must(os.Setenv(azstore.EnvAccountKey, aztest.AccountKey))
		st, err := azstore.New(ctx, azstore.Config{Account: aztest.Account, Container: bucket, Endpoint: s.Endpoint})
		must(err)
		srv := startServerEnv(bin, "az://"+aztest.Account+"/"+bucket, nil, "--azure-endpoint", s.Endpoint,
			"--cache-bytes", "0")
		sc.run(r, "Azure Blob (Azurite on loopback)", "azblob DownloadBuffer", srv, sdk, st)
	}
}

// objectStoreScenario is the 512 MiB tensor's place in its object and the shard request for it.
type objectStoreScenario struct {
	key         string
	start, size int64
	request     api.ShardRequest
}

// run times the SDK download, shardsrv (digest declined, then on: a first read and a later one)
// and the store stage, all but the last alternated, and reports them; it stops srv.
func (sc objectStoreScenario) run(r *report, title, sdkName string, srv *server, sdk func(), st store.Store) {
	url := "http://" + srv.addr + "/v1/shards"
	shard, first := bodyFile(sc.request), firstReads(sc.request)
	ds := interleaved(
		sdk,
		func() { curl(url, shard, sc.size, declined) },
		func() { curl(url, first(), sc.size) },
		func() { curl(url, shard, sc.size) },
	)
	srv.stop()
	base, off, on, later := ds[0], ds[1], ds[2], ds[3]
	info, err := st.Stat(context.Background(), sc.key)
	must(err)
	// The store stage: the store's ReadAt (pinned to the version, as shardsrv reads) in the SDK's
	// parts, as many in flight, into memory: what is left of the gap beyond it is the HTTP hop.
	stage := timed(func() {
		parallel(sc.size, func(ctx context.Context, off, n int64, p []byte) error {
			return st.ReadAt(ctx, sc.key, info.Version, p, sc.start+off)
		})
	})
	r.goal(goal{"512 MiB from " + title + ", digest declined", throughput(sc.size, off),
		sdkName + ": " + throughput(sc.size, base), fmt.Sprintf("%.2f×", ratio(base, off)), "≥ 0.8×"})
	r.goal(goal{"the same, default flags (digest on), first read", throughput(sc.size, on),
		sdkName + ": " + throughput(sc.size, base), fmt.Sprintf("%.2f×", ratio(base, on)), "≥ 0.8×"})
	r.goal(goal{"the same, digest on, later reads (memoised)", throughput(sc.size, later),
		sdkName + ": " + throughput(sc.size, base), fmt.Sprintf("%.2f×", ratio(base, later)), "≥ 0.8×"})
	r.add(title+": one 512 MiB direct shard, curl as the client",
		row{fmt.Sprintf("%s, parallel ranged download of the same bytes into memory, in process (%d MiB parts, "+
			"%d in flight)", sdkName, sdkPart>>20, sdkConcurrency), throughput(sc.size, base), ""},
		row{"shardsrv (cache off), digest declined", throughput(sc.size, off),
			fmt.Sprintf("%.2f× the SDK download (goal ≥ 0.8×)", ratio(base, off))},
		row{"shardsrv (cache off), digest on, first read (hashed, Repr-Digest trailer)", throughput(sc.size, on),
			fmt.Sprintf("%.2f× the SDK download; %.2f× without the digest", ratio(base, on), ratio(off, on))},
		row{"shardsrv (cache off), digest on, later reads (memoised, Repr-Digest header)", throughput(sc.size, later),
			fmt.Sprintf("%.2f× the SDK download; %.2f× without the digest", ratio(base, later), ratio(off, later))},
		row{"shardsrv's store stage alone (the store's ReadAt, same parts, no HTTP hop)", throughput(sc.size, stage),
			fmt.Sprintf("%.2f× the SDK download", ratio(base, stage))},
	)
}

// parallel reads size bytes in sdkPart parts, sdkConcurrency at once, into one buffer.
func parallel(size int64, read func(ctx context.Context, off, n int64, p []byte) error) {
	buf := make([]byte, size)
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(sdkConcurrency)
	for off := int64(0); off < size; off += sdkPart {
		n := min(sdkPart, size-off)
		g.Go(func() error { return read(ctx, off, n, buf[off:off+n]) })
	}
	must(g.Wait())
}
