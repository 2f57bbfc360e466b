//! One road to a namespaced kind's `Api`, for the commands that take `-n NS` or `-A`.

use k8s_openapi::NamespaceResourceScope;
use kube::{Api, Client, Resource};

/// `K` in `namespace`, or in all namespaces for `None`.
pub fn api_in<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}
