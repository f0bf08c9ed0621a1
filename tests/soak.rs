//! Issue 38, item 4: `braid soak` runs random collectives (every op, five dtypes,
//! sizes 0 to 16384, random roots and algorithms) on four workers for 60 s,
//! SIGKILLs one every 10 s and starts a replacement that joins; every result is
//! checked exactly and the long-lived workers' resident memory must stay within
//! 10% of its value after 10 s. `results/scripts/soak.sh` runs the long version.

mod common;

use std::process::Command;
use std::time::Duration;

use common::bounded::{run_bounded, without_braid_env};

#[test]
fn sixty_seconds_of_random_calls_kills_and_joins_give_no_wrong_result() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_braid"));
    without_braid_env(&mut cmd).args(["soak", "--ranks", "4", "--seconds", "60", "--kill-every", "10"]);
    let out = run_bounded(&mut cmd, Duration::from_secs(180));
    let text = out.dump();
    assert!(out.ok(), "{text}");
    let summary = text.lines().rfind(|l| l.starts_with("soak: ") && l.contains("calls checked")).expect(&text);
    assert!(summary.contains(" 0 wrong") && summary.ends_with("PASS"), "{summary}");
    let kills: u64 = summary.split(" kills").next().and_then(|s| s.rsplit(' ').next()?.parse().ok()).expect(summary);
    assert!(kills >= 5, "{summary}");
    let calls: u64 =
        summary.split(" calls checked").next().and_then(|s| s.rsplit(' ').next()?.parse().ok()).expect(summary);
    assert!(calls > 1000, "{summary}");
}
