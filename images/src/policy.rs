//! Where the registry client may go: the rules that keep image resolution from being a way to reach the
//! webhook's network (SSRF). Pure decisions here; the client applies them at the edges (a DNS resolver that
//! drops non-public addresses, a redirect policy, a check of every URL before it is requested).
//!
//! - Registries listed in the registry config (`insecure`, `mirrors` keys and values, `registries`) are trusted
//!   by exact `host:port`; everything else may only be reached at public addresses ([`is_public`]) outside the
//!   deny-list ([`Cidr`], the registry config's `deny`, [`DEFAULT_DENY`] when it has none): the cluster's pod
//!   and Service ranges are public addresses in IPv6 clusters (and sometimes in IPv4 ones).
//! - With a non-empty `registries` allow-list, only those registries (and their mirrors) are resolved.
//! - Redirects are followed only to the same scheme, host and port.
//! - A token realm is accepted only over https (http only for a realm that is itself listed `insecure`), on the
//!   registry's own host and port or on a host listed in `realms` (Docker Hub's `auth.docker.io` built in).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use reqwest::Url;

/// Token realms accepted for every registry besides its own host: Docker Hub's, since `docker.io` images are
/// the default and its registry host issues no tokens itself.
pub const BUILTIN_REALM_HOSTS: &[&str] = &["auth.docker.io"];

/// True for an address anyone on the internet could also reach: not loopback, private, link-local (the cloud
/// metadata service at 169.254.169.254 included), carrier-grade NAT, unique-local, multicast, documentation,
/// benchmarking or unspecified. IPv4 inside IPv6 (mapped, compatible, NAT64, 6to4) is judged by its IPv4 part.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // carrier-grade NAT, 100.64.0.0/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking, 198.18.0.0/15
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_public_v4(v4);
    }
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local, fc00::/7
        || (first & 0xffc0) == 0xfe80 // link-local, fe80::/10
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated), fec0::/10
        || (first == 0x2001 && ip.segments()[1] == 0x0db8) // documentation, 2001:db8::/32
        || (first == 0x3fff && ip.segments()[1] < 0x1000) // documentation, 3fff::/20
        || (first == 0x2001 && ip.segments()[1] < 0x0200) // IETF protocol assignments (Teredo, benchmarking, ORCHID), 2001::/23
        || ip.segments()[..4] == [0x0100, 0, 0, 0] // discard-only, 100::/64
        || ip.segments()[..3] == [0x64, 0xff9b, 1] // local-use NAT64, 64:ff9b:1::/48
        || first == 0x5f00) // segment routing SIDs, 5f00::/16
}

/// Ranges refused besides the non-public ones when the registry config sets no `deny`: the pod and Service
/// ranges that Kubernetes distributions use by default or show in their dual-stack documentation (kubeadm's
/// `10.96.0.0/12`, k3s/RKE2's `10.42.0.0/16` and `10.43.0.0/16` are private anyway and listed for clarity;
/// `2001:cafe:42::/56` and `2001:cafe:43::/112` are the IPv6 ones k3s and RKE2 document). A cluster whose own
/// ranges differ must list them in `deny` (which then replaces these).
pub const DEFAULT_DENY: &[&str] = &[
    "10.96.0.0/12",
    "10.42.0.0/16",
    "10.43.0.0/16",
    "2001:cafe:42::/56",
    "2001:cafe:43::/112",
];

/// An address range, `ADDR/PREFIX` (IPv4 or IPv6; a bare address is one address). An IPv4 range also
/// matches the IPv4-mapped and other IPv4-embedding IPv6 forms of its addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// Why a `deny` entry is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a CIDR (ADDRESS/PREFIX, IPv4 or IPv6)")]
pub struct CidrError(String);

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let error = || CidrError(s.chars().take(64).collect());
        let text = s.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = addr.parse().map_err(|_| error())?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 3 => {
                p.parse::<u8>().map_err(|_| error())?
            }
            Some(_) => return Err(error()),
        };
        if prefix > max {
            return Err(error());
        }
        // Stored masked, so equal ranges compare equal.
        Ok(Cidr {
            network: mask(network, prefix),
            prefix,
        })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cidr, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

impl Cidr {
    /// Whether every address of `other` is in this range (same family only).
    pub fn covers(&self, other: &Cidr) -> bool {
        self.network.is_ipv4() == other.network.is_ipv4()
            && self.prefix <= other.prefix
            && mask(other.network, self.prefix) == self.network
    }

    /// Whether the two ranges share an address (ranges are nested or apart).
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.covers(other) || other.covers(self)
    }

    /// Whether `ip` is in the range; an IPv6 address standing for an IPv4 one is matched by that too.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let direct = match (self.network, ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                mask(ip, self.prefix) == self.network
            }
            _ => false,
        };
        direct
            || match (self.network, ip) {
                (IpAddr::V4(_), IpAddr::V6(v6)) => {
                    embedded_v4(v6).is_some_and(|v4| self.contains(IpAddr::V4(v4)))
                }
                _ => false,
            }
    }
}

/// The built-in deny-list ([`DEFAULT_DENY`]).
pub fn default_deny() -> Vec<Cidr> {
    DEFAULT_DENY.iter().filter_map(|c| c.parse().ok()).collect()
}

/// Whether an unlisted registry may be contacted at `ip`: a public address outside every `deny` range.
pub fn may_connect(ip: IpAddr, deny: &[Cidr]) -> bool {
    is_public(ip) && !deny.iter().any(|c| c.contains(ip))
}

/// The IPv4 address an IPv6 address stands for, where it stands for one.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let octets = ip.octets();
    let tail = Ipv4Addr::new(octets[12], octets[13], octets[14], octets[15]);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    // IPv4-compatible (deprecated) ::a.b.c.d, but not :: and ::1 themselves.
    if s[..6] == [0; 6] && !(ip.is_unspecified() || ip.is_loopback()) {
        return Some(tail);
    }
    // NAT64 well-known prefix 64:ff9b::/96.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    // 6to4, 2002:AABB:CCDD::/48.
    if s[0] == 0x2002 {
        let [a, b] = s[1].to_be_bytes();
        let [c, d] = s[2].to_be_bytes();
        return Some(Ipv4Addr::new(a, b, c, d));
    }
    None
}

/// `host:port` of a URL, lowercased, with the scheme's default port made explicit; `None` without a host.
pub fn authority(url: &Url) -> Option<String> {
    let host = url.host_str()?.to_ascii_lowercase();
    let port = url.port_or_known_default()?;
    Some(format!("{host}:{port}"))
}

/// A registry name from the config or an image (`host` or `host:port`) as the authority its API is served
/// on, given its scheme.
pub fn registry_authority(registry: &str, scheme: &str) -> Option<String> {
    authority(&Url::parse(&format!("{scheme}://{registry}/")).ok()?)
}

/// Whether a redirect from `from` to `to` may be followed: same scheme, host and port only, so a registry can
/// neither send the client (and its credentials) to another host nor downgrade it to plain HTTP.
pub fn redirect_allowed(from: &Url, to: &Url) -> bool {
    from.scheme() == to.scheme() && authority(from).is_some() && authority(from) == authority(to)
}

/// Whether a token realm may be asked for a token (with the pull secret's credential) for a registry whose API
/// is at `registry_url`. `realm_hosts` are the configured extra realm hosts (`host` or `host:port`);
/// `insecure` the authorities configured for plain HTTP.
pub fn realm_allowed(
    realm: &Url,
    registry_url: &Url,
    realm_hosts: &[String],
    insecure: &[String],
) -> bool {
    let Some(realm_authority) = authority(realm) else {
        return false;
    };
    let scheme_ok = match realm.scheme() {
        "https" => true,
        "http" => insecure.contains(&realm_authority),
        _ => false,
    };
    if !scheme_ok || !realm.username().is_empty() || realm.password().is_some() {
        return false;
    }
    let host = realm.host_str().unwrap_or_default().to_ascii_lowercase();
    authority(registry_url).as_deref() == Some(realm_authority.as_str())
        || BUILTIN_REALM_HOSTS.contains(&host.as_str())
        || realm_hosts
            .iter()
            .any(|h| *h == realm_authority || *h == host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn non_public_addresses() {
        for ip in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.0.1",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "192.0.2.1",
            "198.18.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::10.0.0.1",
            "2002:7f00:0001::",
            "2001:db8::1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip} counted as public");
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "169.255.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip} counted as private");
        }
    }

    proptest! {
        /// An IPv4 address and its IPv4-mapped IPv6 form always get the same answer.
        #[test]
        fn mapped_addresses_agree(bits in any::<u32>()) {
            let v4 = Ipv4Addr::from(bits);
            prop_assert_eq!(is_public(IpAddr::V4(v4)), is_public(IpAddr::V6(v4.to_ipv6_mapped())));
        }

        /// Every address in 127/8, 10/8 and 169.254/16 is refused.
        #[test]
        fn private_ranges_are_never_public(low in any::<u16>(), mid in any::<u8>()) {
            let [c, d] = low.to_be_bytes();
            prop_assert!(!is_public(IpAddr::V4(Ipv4Addr::new(127, mid, c, d))));
            prop_assert!(!is_public(IpAddr::V4(Ipv4Addr::new(10, mid, c, d))));
            prop_assert!(!is_public(IpAddr::V4(Ipv4Addr::new(169, 254, c, d))));
        }
    }

    #[test]
    fn special_purpose_ipv6_is_not_public() {
        for ip in [
            "3fff::1",
            "2001::1",          // Teredo
            "2001:2::1",        // benchmarking
            "2001:10::1",       // ORCHID
            "100::1",           // discard-only
            "64:ff9b:1::a00:1", // local-use NAT64
            "5f00::1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip} counted as public");
        }
        for ip in ["2001:200::1", "3fff:1000::1", "2a00:1450::1"] {
            assert!(is_public(ip.parse().unwrap()), "{ip} counted as private");
        }
    }

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_cover_and_overlap_within_their_family() {
        assert!(cidr("10.0.0.0/8").covers(&cidr("10.244.1.0/24")));
        assert!(!cidr("10.244.1.0/24").covers(&cidr("10.0.0.0/8")));
        assert!(cidr("10.244.1.0/24").overlaps(&cidr("10.0.0.0/8")));
        assert!(!cidr("10.42.0.0/16").overlaps(&cidr("10.244.0.0/16")));
        assert!(cidr("0.0.0.0/0").covers(&cidr("192.168.3.0/24")));
        assert!(
            !cidr("::/0").overlaps(&cidr("10.0.0.0/8")),
            "families never overlap"
        );
        assert!(cidr("fd00::/8").covers(&cidr("fd00:10:244::/64")));
    }

    #[test]
    fn cidrs_parse_and_match() {
        let pods = cidr("2001:cafe:42::/56");
        assert!(pods.contains("2001:cafe:42::1".parse().unwrap()));
        assert!(pods.contains("2001:cafe:42:ff::1".parse().unwrap()));
        assert!(!pods.contains("2001:cafe:42:100::1".parse().unwrap()));
        assert!(!pods.contains("10.0.0.1".parse().unwrap()));
        let v4 = cidr("11.0.0.0/8");
        assert!(v4.contains("11.2.3.4".parse().unwrap()));
        assert!(
            v4.contains("::ffff:11.2.3.4".parse().unwrap()),
            "IPv4-mapped"
        );
        assert!(v4.contains("64:ff9b::b02:304".parse().unwrap()), "NAT64");
        assert!(!v4.contains("12.0.0.1".parse().unwrap()));
        // Host bits are masked; a bare address is one address; /0 is everything of its family.
        assert_eq!(cidr("10.1.2.3/8"), cidr("10.0.0.0/8"));
        assert_eq!(cidr("10.1.2.3").to_string(), "10.1.2.3/32");
        assert!(cidr("0.0.0.0/0").contains("8.8.8.8".parse().unwrap()));
        assert!(!cidr("::/0").contains("8.8.8.8".parse().unwrap()));
        assert!(cidr("::/0").contains("2606:4700::1111".parse().unwrap()));
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10/8",
            "a::g/64",
            "10.0.0.0/8/1",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} accepted");
        }
        assert_eq!(default_deny().len(), DEFAULT_DENY.len());
    }

    #[test]
    fn the_deny_list_narrows_what_is_public() {
        let deny = default_deny();
        let pod_v6: IpAddr = "2001:cafe:42::17".parse().unwrap();
        assert!(is_public(pod_v6), "a global IPv6 address is public");
        assert!(!may_connect(pod_v6, &deny), "but in the default deny-list");
        assert!(may_connect("2606:4700::1111".parse().unwrap(), &deny));
        assert!(
            !may_connect("127.0.0.1".parse().unwrap(), &[]),
            "non-public stays refused"
        );
        let custom = [cidr("11.0.0.0/8")];
        assert!(!may_connect("11.0.0.5".parse().unwrap(), &custom));
        assert!(!may_connect("::ffff:11.0.0.5".parse().unwrap(), &custom));
        assert!(may_connect("8.8.8.8".parse().unwrap(), &custom));
    }

    proptest! {
        /// A range contains exactly the addresses that share its first `prefix` bits.
        #[test]
        fn cidr_membership_is_prefix_equality(net in any::<u32>(), ip in any::<u32>(), prefix in 0u8..=32) {
            let c = cidr(&format!("{}/{prefix}", Ipv4Addr::from(net)));
            let shift = 32 - u32::from(prefix);
            let same = net.checked_shr(shift).unwrap_or(0) == ip.checked_shr(shift).unwrap_or(0);
            prop_assert_eq!(c.contains(IpAddr::V4(Ipv4Addr::from(ip))), same);
            prop_assert_eq!(c.contains(IpAddr::V6(Ipv4Addr::from(ip).to_ipv6_mapped())), same);
        }

        #[test]
        fn cidr_membership_v6(net in any::<u128>(), ip in any::<u128>(), prefix in 0u8..=128) {
            let c = cidr(&format!("{}/{prefix}", Ipv6Addr::from(net)));
            let shift = 128 - u32::from(prefix);
            let same = net.checked_shr(shift).unwrap_or(0) == ip.checked_shr(shift).unwrap_or(0);
            // An IPv6 address embedding an IPv4 one never matches an IPv6 range by that IPv4 part.
            prop_assert_eq!(c.contains(IpAddr::V6(Ipv6Addr::from(ip))), same);
        }

        /// The deny-list only ever narrows: nothing it allows is non-public.
        #[test]
        fn may_connect_implies_public(bits in any::<u128>()) {
            let ip = IpAddr::V6(Ipv6Addr::from(bits));
            prop_assert!(!may_connect(ip, &default_deny()) || is_public(ip));
        }
    }

    #[test]
    fn authorities() {
        assert_eq!(
            authority(&url("https://Reg.IO/v2/")).as_deref(),
            Some("reg.io:443")
        );
        assert_eq!(
            authority(&url("http://127.0.0.1:5000/x")).as_deref(),
            Some("127.0.0.1:5000")
        );
        assert_eq!(
            registry_authority("127.0.0.1:5000", "http").as_deref(),
            Some("127.0.0.1:5000")
        );
        assert_eq!(
            registry_authority("ghcr.io", "https").as_deref(),
            Some("ghcr.io:443")
        );
        assert_eq!(
            registry_authority("[::1]:5000", "http").as_deref(),
            Some("[::1]:5000")
        );
    }

    #[test]
    fn redirects_stay_on_the_same_authority() {
        let from = url("https://reg.io/v2/a/manifests/latest");
        assert!(redirect_allowed(&from, &url("https://reg.io/v2/b")));
        assert!(redirect_allowed(&from, &url("https://REG.io:443/v2/b")));
        assert!(!redirect_allowed(&from, &url("https://other.io/v2/b")));
        assert!(!redirect_allowed(&from, &url("https://reg.io:8443/v2/b")));
        assert!(!redirect_allowed(&from, &url("http://reg.io/v2/b")));
        let local = url("http://127.0.0.1:5000/v2/");
        assert!(!redirect_allowed(&local, &url("http://127.0.0.1:5001/v2/")));
        assert!(!redirect_allowed(&local, &url("http://169.254.169.254/")));
    }

    #[test]
    fn realms() {
        let reg = url("https://ghcr.io/v2/a/manifests/latest");
        let none: &[String] = &[];
        assert!(realm_allowed(
            &url("https://ghcr.io/token"),
            &reg,
            none,
            none
        ));
        assert!(!realm_allowed(
            &url("http://ghcr.io/token"),
            &reg,
            none,
            none
        ));
        assert!(!realm_allowed(
            &url("https://evil.io/token"),
            &reg,
            none,
            none
        ));
        assert!(!realm_allowed(
            &url("https://ghcr.io:444/token"),
            &reg,
            none,
            none
        ));
        assert!(!realm_allowed(
            &url("https://u:p@ghcr.io/token"),
            &reg,
            none,
            none
        ));
        assert!(!realm_allowed(
            &url("ftp://ghcr.io/token"),
            &reg,
            none,
            none
        ));
        // Docker Hub's token service is built in; others are configured.
        let hub = url("https://registry-1.docker.io/v2/library/nginx/manifests/latest");
        assert!(realm_allowed(
            &url("https://auth.docker.io/token"),
            &hub,
            none,
            none
        ));
        let listed = ["auth.example.com".to_owned()];
        assert!(realm_allowed(
            &url("https://auth.example.com/t"),
            &reg,
            &listed,
            none
        ));
        assert!(!realm_allowed(
            &url("http://auth.example.com/t"),
            &reg,
            &listed,
            none
        ));
        // Plain HTTP only for a realm that is itself listed insecure, on the registry's own host and port.
        let local = url("http://127.0.0.1:5000/v2/a/manifests/latest");
        let insecure = ["127.0.0.1:5000".to_owned()];
        assert!(realm_allowed(
            &url("http://127.0.0.1:5000/token"),
            &local,
            none,
            &insecure
        ));
        assert!(!realm_allowed(
            &url("http://127.0.0.1:5001/token"),
            &local,
            none,
            &insecure
        ));
        assert!(!realm_allowed(
            &url("https://127.0.0.1:5001/token"),
            &local,
            none,
            &insecure
        ));
    }
}
