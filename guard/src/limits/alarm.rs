//! A timer a connection checks on every read, cheaply.
//!
//! A connection's reads check its idle deadline and its send deadline
//! ([`super::conn`]). Polling a tokio `Sleep` on every read costs a look at
//! the timer's state and a waker registration each time; [`Alarm`] polls it
//! only when it may have fired: once after each reset (which registers the
//! task's waker with the timer driver), then only once the driver marked it
//! elapsed, which it does as it wakes that waker. Between the two, a read
//! costs one load of the timer's state. Its polls ignore tokio's cooperative
//! budget, which would otherwise let a poll end without registering.
//!
//! The waker registered is the connection task's; every poll of the
//! connection's IO comes from that one task, so the registered waker stays
//! the right one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

/// A deadline, polled only when it may have passed (see the module docs).
#[derive(Debug)]
pub(super) struct Alarm {
    sleep: Pin<Box<Sleep>>,
    /// True once a poll since the last reset registered the waker.
    armed: bool,
}

impl Alarm {
    /// An alarm at `deadline`.
    pub(super) fn at(deadline: Instant) -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            armed: false,
        }
    }

    /// True when the deadline has passed; otherwise `cx` is woken when it
    /// does (registered by this or an earlier poll).
    pub(super) fn fired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.armed && !self.sleep.is_elapsed() {
            return false;
        }
        // Unconstrained: with the task's cooperative budget used up, a plain
        // poll returns Pending without registering the waker, and nothing
        // would poll this alarm again.
        let mut sleep = tokio::task::unconstrained(self.sleep.as_mut());
        match Pin::new(&mut sleep).poll(cx) {
            Poll::Ready(()) => true,
            Poll::Pending => {
                self.armed = true;
                false
            }
        }
    }

    /// Moves the deadline; the next [`Alarm::fired`] polls again.
    pub(super) fn reset(&mut self, deadline: Instant) {
        self.sleep.as_mut().reset(deadline);
        self.armed = false;
    }

    /// The deadline.
    pub(super) fn deadline(&self) -> Instant {
        self.sleep.deadline()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    use super::*;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A task whose cooperative budget is used up still registers the
    /// alarm: it is woken at the deadline.
    #[tokio::test(start_paused = true)]
    async fn an_alarm_armed_without_budget_still_wakes_its_task() {
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(woken.clone());
        let start = Instant::now();
        let mut alarm = Alarm::at(start + Duration::from_secs(1));
        // Within one poll of this task: spend its whole budget (a task's
        // budget is 128 units), then arm the alarm.
        let fired = std::future::poll_fn(|task_cx| {
            for _ in 0..200 {
                let spend = std::pin::pin!(tokio::task::consume_budget());
                let _ = spend.poll(task_cx);
            }
            Poll::Ready(alarm.fired(&mut Context::from_waker(&waker)))
        })
        .await;
        assert!(!fired);
        let mut cx = Context::from_waker(&waker);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(alarm.fired(&mut cx));
    }

    /// Fires at its deadline and not before, wakes its task when it does,
    /// and again after a reset.
    #[tokio::test(start_paused = true)]
    async fn fires_at_its_deadline_and_again_after_a_reset() {
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let start = Instant::now();
        let mut alarm = Alarm::at(start + Duration::from_secs(5));
        assert!(!alarm.fired(&mut cx));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(!alarm.fired(&mut cx));
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            woken.0.load(Ordering::SeqCst),
            1,
            "the driver woke the task"
        );
        assert!(alarm.fired(&mut cx));
        assert!(alarm.fired(&mut cx), "stays fired until reset");
        alarm.reset(start + Duration::from_secs(8));
        assert_eq!(alarm.deadline(), start + Duration::from_secs(8));
        assert!(!alarm.fired(&mut cx));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
        assert!(alarm.fired(&mut cx));
    }
}
