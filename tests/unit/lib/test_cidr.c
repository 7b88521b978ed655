/* CIDR lists: the strict address forms, prefixes, host bits, and matching
 * (IPv4-mapped IPv6 included), checked against inet_pton's reading of the
 * same addresses. */
#include <criterion/criterion.h>

#include "kvidx/cidr.h"
#include "kvidx/err.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

static kvidx_cidr_list_t list(const char *s)
{
    kvidx_cidr_list_t l;
    size_t bad = 0;
    cr_assert_eq(kvidx_cidr_parse(s, strlen(s), &l, &bad), 0, "'%s' refused at %zu", s, bad);
    return l;
}

static int in(const kvidx_cidr_list_t *l, const char *addr)
{
    uint8_t a[16];
    if (inet_pton(AF_INET, addr, a) == 1)
        return kvidx_cidr_match(l, 4, a);
    cr_assert_eq(inet_pton(AF_INET6, addr, a), 1, "%s", addr);
    return kvidx_cidr_match(l, 6, a);
}

Test(cidr, ipv4_networks)
{
    kvidx_cidr_list_t l = list("10.0.0.0/8, 192.168.1.7 172.16.0.0/12");
    cr_assert_eq(l.n, 3);
    cr_assert(in(&l, "10.1.2.3"));
    cr_assert(in(&l, "10.255.255.255"));
    cr_assert_not(in(&l, "11.0.0.0"));
    cr_assert(in(&l, "192.168.1.7"));
    cr_assert_not(in(&l, "192.168.1.8"));
    cr_assert(in(&l, "172.31.255.1"));
    cr_assert_not(in(&l, "172.32.0.1"));
    cr_assert(in(&l, "::ffff:10.9.8.7"), "an IPv4-mapped client matches its IPv4 network");
    cr_assert_not(in(&l, "::a09:807"), "IPv4-compatible is not IPv4-mapped");
    kvidx_cidr_list_t all = list("0.0.0.0/0");
    cr_assert(in(&all, "1.2.3.4"));
    cr_assert_not(in(&all, "2001:db8::1"));
}

Test(cidr, ipv6_networks)
{
    kvidx_cidr_list_t l = list("fd00::/8 2001:db8:1::/48 ::1 ::ffff:127.0.0.0/104");
    cr_assert(in(&l, "fd12:3456::1"));
    cr_assert_not(in(&l, "fe00::1"));
    cr_assert(in(&l, "2001:db8:1:ffff::9"));
    cr_assert_not(in(&l, "2001:db8:2::1"));
    cr_assert(in(&l, "::1"));
    cr_assert_not(in(&l, "::2"));
    cr_assert(in(&l, "::ffff:127.1.2.3"));
    cr_assert_not(in(&l, "127.1.2.3"), "an IPv6 network does not match IPv4 clients");
    kvidx_cidr_list_t full = list("1:2:3:4:5:6:7:8 1::8 ::");
    cr_assert(in(&full, "1:2:3:4:5:6:7:8"));
    cr_assert(in(&full, "1:0:0:0:0:0:0:8"));
    cr_assert(in(&full, "::"));
    cr_assert_not(in(&full, "1:2:3:4:5:6:7:9"));
}

Test(cidr, empty_and_bad)
{
    kvidx_cidr_list_t l = list("");
    cr_assert_eq(l.n, 0);
    cr_assert_not(in(&l, "127.0.0.1"));
    l = list(" , ");
    cr_assert_eq(l.n, 0);
    static const struct {
        const char *s;
        size_t bad;
    } bad[] = {
        {"10.0.0.1/8", 1}, {"10.0.0.0/33", 1},   {"10.0.0.0/", 1},
        {"010.0.0.0", 1},  {"10.0.0", 1},        {"10.0.0.0.0", 1},
        {"256.0.0.0", 1},  {"1.2.3.4 x", 2},     {"10.0.0.0/08", 1},
        {"fd00::/129", 1}, {"fd00::1/8", 1},     {"1:::2", 1},
        {"1::2::3", 1},    {"1:2:3:4:5:6:7", 1}, {"1:2:3:4:5:6:7:8:9", 1},
        {"12345::", 1},    {":1::", 1},          {"1:", 1},
        {"g::", 1},        {"::1.2.3", 1},       {"127.0.0.1,::1,-", 3},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t pos = 0;
        cr_assert_eq(kvidx_cidr_parse(bad[i].s, strlen(bad[i].s), &l, &pos), KVIDX_EINVAL, "'%s'",
                     bad[i].s);
        cr_assert_eq(pos, bad[i].bad, "'%s': position %zu", bad[i].s, pos);
        cr_assert_eq(l.n, 0);
    }
    char many[KVIDX_CIDR_MAX * 16 + 32] = "";
    for (int i = 0; i <= KVIDX_CIDR_MAX; i++) {
        char one[16];
        snprintf(one, sizeof(one), "10.0.%d.0/24 ", i);
        strcat(many, one);
    }
    size_t pos = 0;
    cr_assert_eq(kvidx_cidr_parse(many, strlen(many), &l, &pos), KVIDX_EINVAL);
    cr_assert_eq(pos, KVIDX_CIDR_MAX + 1);
}
