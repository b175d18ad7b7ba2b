package clientv3diff

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// revs turns absolute revisions into offsets from the revision a scenario started at, so that
// two servers whose stores begin at different revisions still compare equal.
type revs struct{ base int64 }

func (r revs) of(rev int64) int64 {
	if rev == 0 {
		return 0
	}
	return rev - r.base
}

func startRevs(t *testing.T, cli *clientv3.Client) revs {
	t.Helper()
	resp, err := cli.Get(ctxT(t), "\x00")
	if err != nil {
		t.Fatal(err)
	}
	return revs{base: resp.Header.Revision}
}

func (r revs) kvs(kvs []*mvccpb.KeyValue) string {
	var parts []string
	for _, kv := range kvs {
		parts = append(parts, fmt.Sprintf("%s=%q(c%d,m%d,v%d,lease=%t)", kv.Key, kv.Value,
			r.of(kv.CreateRevision), r.of(kv.ModRevision), kv.Version, kv.Lease != 0))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// errName is an error as a client sees it: etcd's typed error when the message matches one
// (clientv3 rebuilds those from the message text, as kube-apiserver does), else its text.
func errName(err error) string {
	if err == nil {
		return "ok"
	}
	typed := rpctypes.Error(err)
	for _, known := range []error{rpctypes.ErrCompacted, rpctypes.ErrFutureRev, rpctypes.ErrLeaseNotFound,
		rpctypes.ErrKeyNotFound, rpctypes.ErrDuplicateKey, rpctypes.ErrTooManyOps, rpctypes.ErrEmptyKey,
		rpctypes.ErrRequestTooLarge, rpctypes.ErrLeaseTTLTooLarge} {
		if errors.Is(typed, known) || typed == known {
			return "typed:" + known.Error()
		}
	}
	return "other:" + err.Error()
}

func TestKVDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		r := startRevs(t, cli)
		for i := 0; i < 5; i++ {
			resp, err := cli.Put(ctxT(t), fmt.Sprintf("kv/%d", i), fmt.Sprintf("v%d", i))
			tr.add("put kv/%d: %s rev %d", i, errName(err), r.of(resp.Header.Revision))
		}
		resp, err := cli.Put(ctxT(t), "kv/1", "again", clientv3.WithPrevKV())
		tr.add("put prev: %s prev %s rev %d", errName(err), r.kvs([]*mvccpb.KeyValue{resp.PrevKv}), r.of(resp.Header.Revision))

		get := func(what string, key string, opts ...clientv3.OpOption) {
			resp, err := cli.Get(ctxT(t), key, opts...)
			if err != nil {
				tr.add("%s: %s", what, errName(err))
				return
			}
			tr.add("%s: %s count %d more %t rev %d", what, r.kvs(resp.Kvs), resp.Count, resp.More, r.of(resp.Header.Revision))
		}
		get("get one", "kv/1")
		get("get missing", "kv/none")
		get("prefix", "kv/", clientv3.WithPrefix())
		get("prefix limit 2", "kv/", clientv3.WithPrefix(), clientv3.WithLimit(2))
		get("prefix descending by mod", "kv/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend))
		get("keys only", "kv/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		get("count only", "kv/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		get("from key", "kv/3", clientv3.WithFromKey())
		get("range", "kv/1", clientv3.WithRange("kv/3"))
		get("at old revision", "kv/1", clientv3.WithRev(r.base+2))
		get("at future revision", "kv/1", clientv3.WithRev(r.base+1000))
		get("serializable", "kv/2", clientv3.WithSerializable())
		get("min mod revision", "kv/", clientv3.WithPrefix(), clientv3.WithMinModRev(r.base+4))

		del, err := cli.Delete(ctxT(t), "kv/4", clientv3.WithPrevKV())
		tr.add("delete: %s deleted %d prev %s rev %d", errName(err), del.Deleted, r.kvs(del.PrevKvs), r.of(del.Header.Revision))
		del, err = cli.Delete(ctxT(t), "kv/none")
		tr.add("delete missing: %s deleted %d rev %d", errName(err), del.Deleted, r.of(del.Header.Revision))

		_, err = cli.Put(ctxT(t), "", "v")
		tr.add("empty key: %s", errName(err))
		_, err = cli.Put(ctxT(t), "kv/leased", "v", clientv3.WithLease(clientv3.LeaseID(0x1234567)))
		tr.add("unknown lease: %s", errName(err))

		comp, err := cli.Compact(ctxT(t), r.base+3)
		tr.add("compact: %s", errName(err))
		if err == nil {
			tr.add("compact header rev %d", r.of(comp.Header.Revision))
		}
		get("below compaction", "kv/1", clientv3.WithRev(r.base+2))
		get("at compaction", "kv/1", clientv3.WithRev(r.base+3))
		_, err = cli.Compact(ctxT(t), r.base+2)
		tr.add("compact again lower: %s", errName(err))
	})
}

func TestTxnDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		r := startRevs(t, cli)
		put, err := cli.Put(ctxT(t), "txn/a", "1")
		if err != nil {
			t.Fatal(err)
		}
		rev := put.Header.Revision
		txn := func(what string, cmps []clientv3.Cmp, then, els []clientv3.Op) {
			resp, err := cli.Txn(ctxT(t)).If(cmps...).Then(then...).Else(els...).Commit()
			if err != nil {
				tr.add("%s: %s", what, errName(err))
				return
			}
			var rs []string
			for _, op := range resp.Responses {
				switch v := op.Response.(type) {
				case *pb.ResponseOp_ResponseRange:
					rs = append(rs, "range "+r.kvs(v.ResponseRange.Kvs))
				case *pb.ResponseOp_ResponsePut:
					rs = append(rs, fmt.Sprintf("put rev %d", r.of(v.ResponsePut.Header.Revision)))
				case *pb.ResponseOp_ResponseDeleteRange:
					rs = append(rs, fmt.Sprintf("delete %d", v.ResponseDeleteRange.Deleted))
				case *pb.ResponseOp_ResponseTxn:
					rs = append(rs, fmt.Sprintf("txn succeeded=%t n=%d", v.ResponseTxn.Succeeded, len(v.ResponseTxn.Responses)))
				}
			}
			tr.add("%s: succeeded=%t rev %d %s", what, resp.Succeeded, r.of(resp.Header.Revision), strings.Join(rs, "; "))
		}
		// kube-apiserver's own shapes: create, update, delete, each guarded by mod_revision.
		txn("create guarded", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("txn/b"), "=", 0)},
			[]clientv3.Op{clientv3.OpPut("txn/b", "new")}, []clientv3.Op{clientv3.OpGet("txn/b")})
		txn("create conflict", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("txn/b"), "=", 0)},
			[]clientv3.Op{clientv3.OpPut("txn/b", "new")}, []clientv3.Op{clientv3.OpGet("txn/b")})
		txn("update ok", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("txn/a"), "=", rev)},
			[]clientv3.Op{clientv3.OpPut("txn/a", "2")}, []clientv3.Op{clientv3.OpGet("txn/a")})
		txn("update stale", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("txn/a"), "=", rev)},
			[]clientv3.Op{clientv3.OpPut("txn/a", "3")}, []clientv3.Op{clientv3.OpGet("txn/a")})
		txn("delete stale", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision("txn/a"), "=", rev)},
			[]clientv3.Op{clientv3.OpDelete("txn/a")}, []clientv3.Op{clientv3.OpGet("txn/a")})
		txn("compare value and version", []clientv3.Cmp{
			clientv3.Compare(clientv3.Value("txn/a"), "=", "2"),
			clientv3.Compare(clientv3.Version("txn/a"), ">", 1),
			clientv3.Compare(clientv3.CreateRevision("txn/b"), ">", rev)},
			[]clientv3.Op{clientv3.OpPut("txn/c", "x"), clientv3.OpGet("txn/", clientv3.WithPrefix())}, nil)
		txn("nested", nil, []clientv3.Op{clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value("txn/c"), "=", "x")},
			[]clientv3.Op{clientv3.OpDelete("txn/c")}, nil)}, nil)
		txn("duplicate put", nil, []clientv3.Op{clientv3.OpPut("txn/d", "1"), clientv3.OpPut("txn/d", "2")}, nil)
		var many []clientv3.Op
		for i := 0; i < 129; i++ {
			many = append(many, clientv3.OpPut(fmt.Sprintf("txn/many/%d", i), "v"))
		}
		txn("129 ops", nil, many, nil)
		txn("compare lease", []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue("txn/a"), "=", clientv3.NoLease)},
			[]clientv3.Op{clientv3.OpGet("txn/a")}, nil)
	})
}

func TestWatchWithProgressDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		r := startRevs(t, cli)
		for i := 0; i < 3; i++ {
			if _, err := cli.Put(ctxT(t), fmt.Sprintf("w/%d", i), "before"); err != nil {
				t.Fatal(err)
			}
		}
		ctx := clientv3.WithRequireLeader(ctxT(t))
		// From a past revision, with prev_kv, as kube-apiserver's cacher watches.
		wch := cli.Watch(ctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(r.base+2), clientv3.WithPrevKV(),
			clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
		if _, err := cli.Put(ctxT(t), "w/0", "after"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Delete(ctxT(t), "w/1"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Txn(ctxT(t)).Then(clientv3.OpPut("w/a", "1"), clientv3.OpPut("w/b", "2")).Commit(); err != nil {
			t.Fatal(err)
		}
		// A progress request answers only once the watcher has seen everything up to now.
		want := 3 + 3 // events: w/1 and w/2 from the past, the put, the delete, the txn's two.
		seen := 0
		var lastRev int64
		requested := false
		timeout := time.After(requestTimeout)
		for {
			select {
			case resp, ok := <-wch:
				if !ok {
					t.Fatal("watch channel closed")
				}
				if err := resp.Err(); err != nil {
					t.Fatal(err)
				}
				switch {
				case resp.Created:
					tr.add("created rev %d", r.of(resp.Header.Revision))
				case resp.IsProgressNotify():
					tr.add("progress rev %d after %d events", r.of(resp.Header.Revision), seen)
					if requested {
						return
					}
				default:
					// How events are split into responses is the server's choice (etcd sends a
					// catching-up watcher's past in one response, leasehold one per revision),
					// so each event is its own line. What both must keep: one revision's events
					// are never split across responses, and none is newer than its header.
					if first := resp.Events[0].Kv.ModRevision; first == lastRev {
						t.Fatalf("revision %d split across responses", first)
					}
					for _, ev := range resp.Events {
						prev := "-"
						if ev.PrevKv != nil {
							prev = r.kvs([]*mvccpb.KeyValue{ev.PrevKv})
						}
						tr.add("event: %s %s prev %s", ev.Type, r.kvs([]*mvccpb.KeyValue{ev.Kv}), prev)
						if ev.Kv.ModRevision > resp.Header.Revision {
							t.Fatalf("an event at %d in a response whose header says %d", ev.Kv.ModRevision, resp.Header.Revision)
						}
						lastRev = ev.Kv.ModRevision
					}
					seen += len(resp.Events)
				}
				if seen == want && !requested {
					requested = true
					if err := cli.RequestProgress(ctx); err != nil {
						t.Fatal(err)
					}
				}
			case <-timeout:
				t.Fatalf("watch saw %d of %d events, progress requested %t", seen, want, requested)
			}
		}
	})
}

func TestWatchCompactedDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		r := startRevs(t, cli)
		for i := 0; i < 4; i++ {
			if _, err := cli.Put(ctxT(t), "wc/k", fmt.Sprint(i)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cli.Compact(ctxT(t), r.base+3); err != nil {
			t.Fatal(err)
		}
		for _, from := range []int64{2, 3} {
			wch := cli.Watch(ctxT(t), "wc/k", clientv3.WithRev(r.base+from))
			resp := <-wch
			tr.add("watch from %d: canceled=%t compact_revision=%d err=%s events=%d",
				from, resp.Canceled, r.of(resp.CompactRevision), errName(resp.Err()), len(resp.Events))
		}
	})
}

// TestRangeStreamDifferential: etcd 3.7's KV.RangeStream, through clientv3's GetStream, over a
// range large enough for several chunks. Each answer is the chunks merged (as clientv3 merges
// them), plus whether only the last chunk carried the header, more and count; the errors for
// what RangeStream refuses (custom sort orders, revision filters, a compacted revision).
func TestRangeStreamDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		r := startRevs(t, cli)
		value := strings.Repeat("v", 1000)
		for i := 0; i < 300; i++ {
			if _, err := cli.Put(ctxT(t), fmt.Sprintf("rs/%04d", i), value); err != nil {
				t.Fatal(err)
			}
		}
		stream := func(what string, key string, opts ...clientv3.OpOption) {
			ch, err := cli.GetStream(ctxT(t), key, opts...)
			if err != nil {
				tr.add("%s: %s", what, errName(err))
				return
			}
			merged := &pb.RangeResponse{}
			chunks, lastOnly := 0, true
			var streamErr error
			for resp := range ch {
				if err := resp.Err(); err != nil {
					streamErr = err
					break
				}
				chunks++
				rr := resp.RangeResponse
				if rr.Header != nil || rr.Count != 0 || rr.More {
					if merged.Header != nil {
						lastOnly = false
					}
					merged.Header, merged.Count, merged.More = rr.Header, rr.Count, rr.More
				} else if merged.Header != nil {
					lastOnly = false
				}
				merged.Kvs = append(merged.Kvs, rr.Kvs...)
			}
			if streamErr != nil {
				tr.add("%s: %s", what, errName(streamErr))
				return
			}
			first, last := "", ""
			if n := len(merged.Kvs); n > 0 {
				first, last = string(merged.Kvs[0].Key), string(merged.Kvs[n-1].Key)
			}
			rev := int64(0)
			if merged.Header != nil {
				rev = r.of(merged.Header.Revision)
			}
			tr.add("%s: %d kvs [%s..%s] count %d more %t rev %d header-last-only %t several-chunks %t",
				what, len(merged.Kvs), first, last, merged.Count, merged.More, rev, lastOnly, chunks > 1)
		}
		stream("all", "rs/", clientv3.WithPrefix())
		stream("limit 50", "rs/", clientv3.WithPrefix(), clientv3.WithLimit(50))
		stream("keys only", "rs/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		stream("count only", "rs/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		stream("from key", "rs/0290", clientv3.WithFromKey())
		stream("range", "rs/0010", clientv3.WithRange("rs/0200"))
		stream("serializable", "rs/", clientv3.WithPrefix(), clientv3.WithSerializable())
		stream("at an old revision", "rs/", clientv3.WithPrefix(), clientv3.WithRev(r.base+100))
		stream("missing", "none/", clientv3.WithPrefix())
		stream("sorted descending", "rs/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
		stream("min mod revision", "rs/", clientv3.WithPrefix(), clientv3.WithMinModRev(r.base+5))
		if _, err := cli.Compact(ctxT(t), r.base+200); err != nil {
			t.Fatal(err)
		}
		stream("compacted", "rs/", clientv3.WithPrefix(), clientv3.WithRev(r.base+100))
	})
}
