//! Notifications: the webhook and the command.

internal_event! {
    /// A notification could not be encoded or sent (`notifier`: the webhook, the command, or
    /// both while encoding).
    NotificationFailed { notifier: String, alert: String, error: String }
    |e| format!("{} {}: {}", e.notifier, e.alert, e.error)
}

internal_event! {
    /// A notification was dropped: its notifier's queue was full, or still busy at shutdown.
    NotificationDropped { notifier: String, what: String }
    |e| format!("{}: {}", e.notifier, e.what)
}

internal_event! {
    /// A transition held back by the notification rate limit.
    NotificationRateLimited { alert: String, state: String }
    |e| format!("{} {} held back by the rate limit", e.alert, e.state)
}
