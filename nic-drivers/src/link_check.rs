//! When a raw backend looks at whether its interface is still there: after
//! a run of receives that found nothing, one system call per run, as a
//! removed interface shows only in the socket's state (see the backends'
//! `check_link`).

/// Receives in a row that found nothing.
#[derive(Debug, Default)]
pub(crate) struct EmptyRecvs(u32);

impl EmptyRecvs {
    /// Notes a receive that moved `n` frames; true once every `every`
    /// empty receives in a row: time to look at the link.
    pub(crate) fn due(&mut self, n: usize, every: u32) -> bool {
        if n > 0 {
            self.0 = 0;
            return false;
        }
        self.0 = self.0.wrapping_add(1);
        self.0.is_multiple_of(every)
    }
}

#[cfg(test)]
mod tests {
    use super::EmptyRecvs;

    #[test]
    fn due_every_nth_empty_receive_in_a_row() {
        let mut e = EmptyRecvs::default();
        let due: Vec<bool> = [0, 0, 0, 1, 0, 0, 0, 0]
            .iter()
            .map(|&n| e.due(n, 3))
            .collect();
        assert_eq!(due, [false, false, true, false, false, false, true, false]);
    }
}
