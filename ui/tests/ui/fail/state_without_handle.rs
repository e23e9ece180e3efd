use axum::Router;
use axum::routing::post;
use idem_tower::idempotent;

#[derive(Clone)]
struct AppState {
    #[allow(dead_code)]
    name: &'static str,
}

#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order() {}

fn main() {
    // The router state does not give an `Idempotency` handle: no `FromRef`.
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .with_state(AppState { name: "app" });
}
