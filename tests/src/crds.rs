//! Installing a CustomResourceDefinition from a YAML file on a test cluster and waiting until the
//! API server serves it: the one copy behind [`crate::install_fleet_crd`] and
//! [`crate::install_argo_rollouts_crd`].

use std::path::Path;

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::runtime::wait::{Condition, conditions::is_crd_established};
use kube::{Api, Client};

/// Reads and parses the single CRD document in `path`.
pub(crate) fn read_crd(path: &Path) -> anyhow::Result<CustomResourceDefinition> {
    let yaml =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_saphyr::from_str(&yaml).with_context(|| format!("parsing {}", path.display()))
}

/// Creates the CRD in `path` (an existing CRD of that name is left as it is: tests of one binary
/// share the control plane) and waits, at most [`crate::DEFAULT_TIMEOUT`], until it is
/// Established, discovery lists its plural under every served `group/version`, and listing it
/// succeeds. Returns the CRD as read from the file.
pub(crate) async fn install_crd(
    client: &Client,
    path: &Path,
) -> anyhow::Result<CustomResourceDefinition> {
    let crd = read_crd(path)?;
    let Some(name) = crd.metadata.name.clone() else {
        bail!("the CRD in {} has no metadata.name", path.display());
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).with_context(|| format!("creating CRD {name}")),
    }

    let group = crd.spec.group.clone();
    let plural = crd.spec.names.plural.clone();
    let served: Vec<ApiResource> = crd
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| ApiResource {
            group: group.clone(),
            version: v.name.clone(),
            api_version: format!("{group}/{}", v.name),
            kind: crd.spec.names.kind.clone(),
            plural: plural.clone(),
        })
        .collect();
    if served.is_empty() {
        bail!("CRD {name} in {} serves no version", path.display());
    }

    crate::wait_until(
        &format!("CRD {name} to be Established and served"),
        crate::DEFAULT_TIMEOUT,
        || {
            let (client, crds, name, served) =
                (client.clone(), crds.clone(), name.clone(), served.clone());
            async move {
                let current = crds.get_opt(&name).await?;
                if !is_crd_established().matches_object(current.as_ref()) {
                    return Ok(false);
                }
                for resource in &served {
                    let discovered = client
                        .list_api_group_resources(&resource.api_version)
                        .await
                        .with_context(|| format!("discovery of {}", resource.api_version))?;
                    if !discovered
                        .resources
                        .iter()
                        .any(|r| r.name == resource.plural)
                    {
                        return Ok(false);
                    }
                    Api::<DynamicObject>::all_with(client.clone(), resource)
                        .list(&ListParams::default().limit(1))
                        .await
                        .with_context(|| {
                            format!("listing {} {}", resource.api_version, resource.plural)
                        })?;
                }
                Ok(true)
            }
        },
    )
    .await?;
    Ok(crd)
}
