//! Where a request comes from, as the server shares out what one client may hold (login
//! checks, response bytes): all of loopback is one source, an IPv6 /64 is one, an IPv4 address
//! alone is one. A client cycling through 127.x.y.z or its IPv6 prefix is one client.
use std::net::{IpAddr, Ipv4Addr};

/// A request's source network.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Network {
    Loopback,
    V4(Ipv4Addr),
    /// The first 64 bits of an IPv6 address.
    V6(u64),
}

impl Network {
    pub fn of(ip: IpAddr) -> Self {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
            _ if ip.is_loopback() => Self::Loopback,
            IpAddr::V4(v4) => Self::V4(v4),
            IpAddr::V6(v6) => Self::V6((u128::from(v6) >> 64) as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_aggregate_loopback_and_ipv6_prefixes() {
        let n = |s: &str| Network::of(s.parse().unwrap());
        assert_eq!(n("127.0.0.1"), n("127.9.8.7"));
        assert_eq!(n("::1"), n("127.0.0.2"));
        assert_eq!(n("::ffff:192.0.2.7"), n("192.0.2.7"));
        assert_eq!(n("2001:db8:1:2::1"), n("2001:db8:1:2:ffff::9"));
        assert_ne!(n("2001:db8:1:2::1"), n("2001:db8:1:3::1"));
        assert_ne!(n("192.0.2.7"), n("192.0.2.8"));
    }
}
