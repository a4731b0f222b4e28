//! `drover role ...`: the Unix users a role's tasks may run as (its own, and those
//! an admin granted), granting and revoking one, and the line `drover job status`
//! prints for a job flagged for running as a user no longer granted. The rendering
//! is pure and tested here.

use drover_common::wire::RoleView;

use crate::args::RoleCommand;
use crate::Endpoint;

/// Runs a `drover role ...` command.
pub async fn run(master: &Endpoint, command: RoleCommand) -> anyhow::Result<bool> {
    let client = master.client()?;
    let (view, json) = match command {
        RoleCommand::GrantUser { role, user } => {
            (client.grant_user(&role, &user, true).await?, false)
        }
        RoleCommand::RevokeUser { role, user } => {
            (client.grant_user(&role, &user, false).await?, false)
        }
        RoleCommand::Show { role, json } => (client.role(&role).await?, json),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", role_details(&view));
    }
    Ok(true)
}

/// `drover role show`.
pub fn role_details(view: &RoleView) -> String {
    let mut out = format!("Role:    {}\n", view.role);
    out.push_str(&format!("User:    {} (the role's own)\n", view.user));
    if view.granted_users.is_empty() {
        out.push_str("Granted: none (drover role grant-user ROLE USER)\n");
    } else {
        out.push_str(&format!("Granted: {}\n", view.granted_users.join(", ")));
    }
    for job in &view.ungranted_jobs {
        out.push_str(&format!(
            "FLAGGED: job {job} runs as a user role {} is not granted; it runs on, its next update, restart or rollback is refused\n",
            view.role
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_shows_its_own_user_its_grants_and_its_flagged_jobs() {
        let mut view = RoleView {
            role: "www".into(),
            user: "www".into(),
            granted_users: vec![],
            ungranted_jobs: vec![],
        };
        let text = role_details(&view);
        assert!(text.contains("User:    www (the role's own)"), "{text}");
        assert!(text.contains("Granted: none"), "{text}");
        assert!(!text.contains("FLAGGED"), "{text}");
        view.granted_users = vec!["backup".into(), "daemon".into()];
        view.ungranted_jobs = vec!["www/prod/app".into()];
        let text = role_details(&view);
        assert!(text.contains("Granted: backup, daemon"), "{text}");
        assert!(text.contains("FLAGGED: job www/prod/app"), "{text}");
        let line = crate::render::ungranted_line("www", "daemon");
        assert!(line.contains("drover role grant-user www daemon"), "{line}");
    }
}
