//! Peer transport. A one-member cluster has no peers, so openraft never asks for a connection;
//! if it ever did (a membership change before the cluster transport exists), every RPC reports
//! the peer unreachable rather than pretending to deliver.

use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use crate::TypeConfig;

#[derive(Clone, Debug, Default)]
pub struct NoPeers;

#[derive(Debug)]
pub struct Unconnected {
    target: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("no peer transport yet: member {0:x} is unreachable")]
struct NoTransport(u64);

impl Unconnected {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<u64, BasicNode, E> {
        RPCError::Unreachable(Unreachable::new(&NoTransport(self.target)))
    }
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = Unconnected;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Unconnected {
        Unconnected { target }
    }
}

impl RaftNetwork<TypeConfig> for Unconnected {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(self.unreachable())
    }
}
