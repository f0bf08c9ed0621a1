//! Planner dispatch (stub, replaced by the planner work).
use super::{PlanRequest, Schedule};
pub(crate) fn plan(_req: &PlanRequest) -> Result<Schedule, String> {
    Err("not yet planned".into())
}
