//! Spawned tasks that end with their owner, wherever in the data flow they run (the copy's
//! chunk finishers, the stream beside the apply loop, progress tickers).

/// Aborts a spawned task when dropped: an owner that returns early (an error, a shutdown)
/// leaves no task running on its own.
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
