//! raft-rs logs through slog; this drain hands its records to `tracing` (target
//! `leasehold_consensus::raft`), key-value pairs included.

use std::fmt::Write as _;

struct TracingDrain;

struct Pairs(String);

impl slog::Serializer for Pairs {
    fn emit_arguments(&mut self, key: slog::Key, value: &std::fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(
        &self,
        record: &slog::Record<'_>,
        values: &slog::OwnedKVList,
    ) -> Result<(), slog::Never> {
        let mut pairs = Pairs(String::new());
        let _ = slog::KV::serialize(&record.kv(), record, &mut pairs);
        let _ = slog::KV::serialize(values, record, &mut pairs);
        let message = record.msg();
        let pairs = pairs.0;
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "leasehold_consensus::raft", "{message}{pairs}")
            }
            slog::Level::Warning => {
                tracing::warn!(target: "leasehold_consensus::raft", "{message}{pairs}")
            }
            slog::Level::Info => {
                tracing::info!(target: "leasehold_consensus::raft", "{message}{pairs}")
            }
            slog::Level::Debug => {
                tracing::debug!(target: "leasehold_consensus::raft", "{message}{pairs}")
            }
            slog::Level::Trace => {
                tracing::trace!(target: "leasehold_consensus::raft", "{message}{pairs}")
            }
        }
        Ok(())
    }
}

/// A logger for [`crate::Core::open`] that writes raft-rs's records to `tracing`.
pub fn tracing_logger() -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!())
}
