package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"golang.org/x/sync/errgroup"

	"github.com/shardsrv/shardsrv/internal/azstore/aztest"
	"github.com/shardsrv/shardsrv/internal/gcsstore/gcstest"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// The SDK downloads the store scenarios compare with: 8 MiB parts, 8 in flight.
const sdkPart, sdkConcurrency = 8 << 20, 8

// objectStoreScenarios: one 512 MiB direct shard from the GCS and Azure emulators, through
// shardsrv against the same SDK's parallel ranged download of the same bytes in the same run.
func objectStoreScenarios(r *report, bin, dir string) {
	big := safetensorsFile(safetensors.TensorData{Name: "w", DType: "BF16", Shape: []int64{bigRows, bigCols},
		Data: randomBytes(bigRows*bigCols*2, 4)})
	size := int64(bigRows * bigCols * 2)
	start := int64(len(big)) - size
	key := "big/model.safetensors"
	if want("gcs") {
		if gcsBin, err := gcstest.Binary(); err != nil {
			log.Printf("fake-gcs-server not found (make tools): skipping the GCS scenario")
		} else {
			must(os.MkdirAll(filepath.Join(dir, "gcs"), 0o755))
			s, err := gcstest.Run(gcsBin, filepath.Join(dir, "gcs"))
			must(err)
			defer s.Stop()
			ctx := context.Background()
			must(s.Client.Bucket(bucket).Create(ctx, "bench", nil))
			log.Printf("uploading 512 MiB to fake-gcs-server")
			must(s.PutErr(bucket, key, big))
			obj := s.Client.Bucket(bucket).Object(key)
			base := timed(func() {
				parallel(size, func(ctx context.Context, off, n int64, p []byte) error {
					rd, err := obj.NewRangeReader(ctx, start+off, n)
					if err != nil {
						return err
					}
					defer rd.Close()
					_, err = io.ReadFull(rd, p)
					return err
				})
			})
			srv := startServerEnv(bin, "gs://"+bucket, nil, "--gcs-endpoint", s.Endpoint, "--cache-bytes", "0")
			got := timed(func() { fetch("http://"+srv.addr+"/v1/shards", bigSlab(bigRows)) })
			srv.stop()
			storeRows(r, "GCS (fake-gcs-server on loopback)", "Go storage SDK", size, base, got)
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
		ctx := context.Background()
		_, err = s.Client.CreateContainer(ctx, bucket, nil)
		must(err)
		log.Printf("uploading 512 MiB to Azurite")
		must(s.PutErr(bucket, key, big))
		buf := make([]byte, size)
		base := timed(func() {
			_, err := s.Client.DownloadBuffer(ctx, bucket, key, buf, &azblob.DownloadBufferOptions{
				Range: azblob.HTTPRange{Offset: start, Count: size}, BlockSize: sdkPart, Concurrency: sdkConcurrency})
			must(err)
		})
		env := []string{"AZURE_STORAGE_KEY=" + aztest.AccountKey}
		srv := startServerEnv(bin, "az://"+aztest.Account+"/"+bucket, env, "--azure-endpoint", s.Endpoint,
			"--cache-bytes", "0")
		got := timed(func() { fetch("http://"+srv.addr+"/v1/shards", bigSlab(bigRows)) })
		srv.stop()
		storeRows(r, "Azure Blob (Azurite on loopback)", "azblob DownloadBuffer", size, base, got)
	}
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

func storeRows(r *report, title, sdk string, size int64, base, got []time.Duration) {
	r.goal(goal{"512 MiB from " + title, throughput(size, got), sdk + ": " + throughput(size, base),
		fmt.Sprintf("%.2f×", ratio(base, got)), "≥ 0.8×"})
	r.add(title+": one 512 MiB direct shard",
		row{fmt.Sprintf("%s, parallel ranged download of the same bytes (%d MiB parts, %d in flight)", sdk,
			sdkPart>>20, sdkConcurrency), throughput(size, base), ""},
		row{"shardsrv (cache off), through HTTP to the client", throughput(size, got),
			fmt.Sprintf("%.2f× the SDK download (goal ≥ 0.8×)", ratio(base, got))},
	)
}
