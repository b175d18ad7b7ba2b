package clientv3diff

// etcd's exact answers where a client library can tell: which response header fields each
// Maintenance and Cluster call sets, what an oversized request gets, and what nested txns get
// at several depths. The same checks run against etcd 3.4 in crates/leasehold/tests/e2e/answers.rs.

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/status"
)

// codeOf is an error's gRPC code and message, as the wire carried them.
func codeOf(err error) string {
	if err == nil {
		return "ok"
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return fmt.Sprintf("%s: %s", ee.Code(), ee.Error())
	}
	if s, ok := status.FromError(err); ok {
		return fmt.Sprintf("%s: %s", s.Code(), s.Message())
	}
	return "not a status: " + err.Error()
}

// headerOf says which fields a response header sets (the revision relative to the scenario's).
func headerOf(h *pb.ResponseHeader, r revs) string {
	if h == nil {
		return "no header"
	}
	rev := "0"
	if h.Revision != 0 {
		rev = fmt.Sprintf("%+d", r.of(h.Revision))
	}
	return fmt.Sprintf("cluster_id=%t member_id=%t revision=%s raft_term=%t",
		h.ClusterId != 0, h.MemberId != 0, rev, h.RaftTerm != 0)
}

func TestMaintenanceAndClusterHeadersDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		r := startRevs(t, cli)
		if _, err := cli.Put(ctxT(t), "headers/a", "1"); err != nil {
			t.Fatal(err)
		}
		mc := pb.NewMaintenanceClient(cli.ActiveConnection())
		cc := pb.NewClusterClient(cli.ActiveConnection())
		call := func(what string, h func() (*pb.ResponseHeader, error)) {
			header, err := h()
			if err != nil {
				tr.add("%s: %s", what, codeOf(err))
				return
			}
			tr.add("%s: %s", what, headerOf(header, r))
		}
		var self uint64
		call("Status", func() (*pb.ResponseHeader, error) {
			resp, err := mc.Status(ctxT(t), &pb.StatusRequest{})
			if err == nil {
				self = resp.Header.MemberId
			}
			return resp.GetHeader(), err
		})
		call("Defragment", func() (*pb.ResponseHeader, error) {
			resp, err := mc.Defragment(ctxT(t), &pb.DefragmentRequest{})
			return resp.GetHeader(), err
		})
		call("Hash", func() (*pb.ResponseHeader, error) {
			resp, err := mc.Hash(ctxT(t), &pb.HashRequest{})
			return resp.GetHeader(), err
		})
		call("HashKV", func() (*pb.ResponseHeader, error) {
			resp, err := mc.HashKV(ctxT(t), &pb.HashKVRequest{})
			return resp.GetHeader(), err
		})
		call("MoveLeader to itself", func() (*pb.ResponseHeader, error) {
			resp, err := mc.MoveLeader(ctxT(t), &pb.MoveLeaderRequest{TargetID: self})
			return resp.GetHeader(), err
		})
		for _, a := range []struct {
			what   string
			action pb.AlarmRequest_AlarmAction
		}{{"Alarm GET", pb.AlarmRequest_GET}, {"Alarm ACTIVATE", pb.AlarmRequest_ACTIVATE},
			{"Alarm DEACTIVATE", pb.AlarmRequest_DEACTIVATE}} {
			call(a.what, func() (*pb.ResponseHeader, error) {
				resp, err := mc.Alarm(ctxT(t), &pb.AlarmRequest{Action: a.action, MemberID: self, Alarm: pb.AlarmType_NOSPACE})
				return resp.GetHeader(), err
			})
		}
		// Every message of a snapshot stream: which carry a header.
		stream, err := mc.Snapshot(ctxT(t), &pb.SnapshotRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var shapes []string
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("snapshot: %v", err)
			}
			shape := headerOf(resp.GetHeader(), r)
			if len(shapes) == 0 || shapes[len(shapes)-1] != shape {
				shapes = append(shapes, shape)
			}
		}
		tr.add("Snapshot messages: %s", strings.Join(shapes, ", then "))
		call("MemberList", func() (*pb.ResponseHeader, error) {
			resp, err := cc.MemberList(ctxT(t), &pb.MemberListRequest{})
			return resp.GetHeader(), err
		})
		var learner uint64
		call("MemberAdd learner", func() (*pb.ResponseHeader, error) {
			resp, err := cc.MemberAdd(ctxT(t), &pb.MemberAddRequest{PeerURLs: []string{"http://127.0.0.1:9"}, IsLearner: true})
			if err == nil {
				learner = resp.Member.ID
			}
			return resp.GetHeader(), err
		})
		call("MemberUpdate", func() (*pb.ResponseHeader, error) {
			resp, err := cc.MemberUpdate(ctxT(t), &pb.MemberUpdateRequest{ID: learner, PeerURLs: []string{"http://127.0.0.1:10"}})
			return resp.GetHeader(), err
		})
		call("MemberPromote of a learner that never started", func() (*pb.ResponseHeader, error) {
			resp, err := cc.MemberPromote(ctxT(t), &pb.MemberPromoteRequest{ID: learner})
			return resp.GetHeader(), err
		})
		call("MemberRemove", func() (*pb.ResponseHeader, error) {
			resp, err := cc.MemberRemove(ctxT(t), &pb.MemberRemoveRequest{ID: learner})
			return resp.GetHeader(), err
		})
	})
}

// bigClient sends requests of up to 64 MiB, so the server (not the client) decides.
func bigClient(t *testing.T, c *cluster) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:          c.endpoints(),
		Logger:             zap.NewNop(),
		MaxCallSendMsgSize: 64 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func TestOversizedRequestsDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := bigClient(t, c)
		for _, size := range []int{1 << 20, 3 << 20, 5 << 20, 40 << 20} {
			_, err := cli.Put(ctxT(t), "big", strings.Repeat("x", size))
			tr.add("put of %d MiB: %s", size>>20, codeOf(err))
		}
		// The server is still there.
		_, err := cli.Put(ctxT(t), "small", "1")
		tr.add("put after: %s", codeOf(err))
	})
}

// nestedTxn is a txn nested depth levels deep, the innermost one putting one key.
func nestedTxn(depth int) clientv3.Op {
	op := clientv3.OpPut("nested", fmt.Sprint(depth))
	for i := 1; i < depth; i++ {
		op = clientv3.OpTxn(nil, []clientv3.Op{op}, nil)
	}
	return op
}

func TestNestedTxnDepthsDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := bigClient(t, c)
		r := startRevs(t, cli)
		for _, depth := range []int{10, 64, 100, 101, 200, 2000} {
			resp, err := cli.Txn(ctxT(t)).Then(nestedTxn(depth)).Commit()
			if err != nil {
				tr.add("txn nested %d deep: %s", depth, codeOf(err))
				continue
			}
			tr.add("txn nested %d deep: ok, revision %+d", depth, r.of(resp.Header.Revision))
		}
		get, err := cli.Get(ctxT(t), "nested")
		if err != nil {
			t.Fatal(err)
		}
		tr.add("after: %s", r.kvs(get.Kvs))
	})
}
